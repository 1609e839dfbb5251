package model

import (
	"fmt"
	"regexp/syntax"
	"slices"
	"unicode"
	"unicode/utf8"
)

// RE2ProgramSize returns the size, in instructions, of the RE2 program Envoy compiles regular
// expression re to: the value Envoy compares with re2.max_program_size.error_level (Envoy's
// CompiledGoogleReMatcher, RE2::ProgramSize). It returns an error when re does not parse as RE2
// syntax.
//
// The size is computed by a model of RE2's compiler in Latin-1 mode, the mode Envoy 1.40 matches
// in: the parse (Go's regexp/syntax, whose parser and simplifier are RE2's), a required literal
// prefix after ^ set aside and ^ / $ at the ends removed, one instruction per byte range (a
// class as its byte ranges, ASCII letters folded where it has both cases) with Alt, Capture,
// EmptyWidth and Nop instructions as RE2 links them, the unanchored ".*?" loop, then RE2's
// Optimize and Flatten passes, which make the program a list per "root" instruction. Tests
// compare it with the real Envoy over a corpus of expressions; where RE2 simplifies more than Go
// (merging repeats such as "a+a+", repeats of ^ or \b), the model counts a little more.
func RE2ProgramSize(re string) (int, error) {
	p, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return 0, fmt.Errorf("parse regex: %w", err)
	}
	return re2ProgramSize(p), nil
}

// re2Op is an RE2 instruction opcode (re2/prog.h).
type re2Op uint8

const (
	re2Fail re2Op = iota
	re2Alt
	re2AltMatch
	re2ByteRange
	re2Capture
	re2EmptyWidth
	re2Nop
	re2Match
)

type re2Inst struct {
	op        re2Op
	out, out1 int
	lo, hi    byte
}

// re2Hole is an unfilled successor: inst id's out, or out1 when second.
type re2Hole struct {
	id     int
	second bool
}

// re2Frag is a compiled fragment: its first instruction (0: matches nothing), its unfilled
// successors and whether it matches the empty string.
type re2Frag struct {
	begin    int
	end      []re2Hole
	nullable bool
}

type re2Compiler struct {
	inst []re2Inst
}

func (c *re2Compiler) add(in re2Inst) int {
	c.inst = append(c.inst, in)
	return len(c.inst) - 1
}

func (c *re2Compiler) fill(holes []re2Hole, to int) {
	for _, h := range holes {
		if h.second {
			c.inst[h.id].out1 = to
		} else {
			c.inst[h.id].out = to
		}
	}
}

func (c *re2Compiler) single(op re2Op, lo, hi byte, nullable bool) re2Frag {
	id := c.add(re2Inst{op: op, lo: lo, hi: hi})
	return re2Frag{begin: id, end: []re2Hole{{id: id}}, nullable: nullable}
}

func (c *re2Compiler) cat(a, b re2Frag) re2Frag {
	if a.begin == 0 || b.begin == 0 {
		return re2Frag{}
	}
	// A lone Nop in front is elided.
	if in := c.inst[a.begin]; in.op == re2Nop && in.out == 0 && len(a.end) == 1 && a.end[0] == (re2Hole{id: a.begin}) {
		c.fill(a.end, b.begin)
		return b
	}
	c.fill(a.end, b.begin)
	return re2Frag{begin: a.begin, end: b.end, nullable: a.nullable && b.nullable}
}

func (c *re2Compiler) alt(a, b re2Frag) re2Frag {
	switch {
	case a.begin == 0:
		return b
	case b.begin == 0:
		return a
	}
	id := c.add(re2Inst{op: re2Alt, out: a.begin, out1: b.begin})
	return re2Frag{begin: id, end: append(append([]re2Hole(nil), a.end...), b.end...), nullable: a.nullable || b.nullable}
}

// loop adds the Alt of a repeat of a: the Alt tries a first (second when nongreedy) and leaves
// by the other successor.
func (c *re2Compiler) loop(a re2Frag, nongreedy bool) (int, []re2Hole) {
	id := c.add(re2Inst{op: re2Alt})
	if nongreedy {
		c.inst[id].out1 = a.begin
		return id, []re2Hole{{id: id}}
	}
	c.inst[id].out = a.begin
	return id, []re2Hole{{id: id, second: true}}
}

func (c *re2Compiler) plus(a re2Frag, nongreedy bool) re2Frag {
	id, end := c.loop(a, nongreedy)
	c.fill(a.end, id)
	return re2Frag{begin: a.begin, end: end, nullable: a.nullable}
}

func (c *re2Compiler) star(a re2Frag, nongreedy bool) re2Frag {
	if a.nullable {
		// RE2 compiles the star of a nullable fragment as (a+)?, for priority order.
		return c.quest(c.plus(a, nongreedy), nongreedy)
	}
	id, end := c.loop(a, nongreedy)
	c.fill(a.end, id)
	return re2Frag{begin: id, end: end, nullable: true}
}

func (c *re2Compiler) quest(a re2Frag, nongreedy bool) re2Frag {
	if a.begin == 0 {
		return c.single(re2Nop, 0, 0, true)
	}
	id, end := c.loop(a, nongreedy)
	return re2Frag{begin: id, end: append(end, a.end...), nullable: true}
}

func (c *re2Compiler) capture(a re2Frag) re2Frag {
	if a.begin == 0 {
		return re2Frag{}
	}
	open := c.add(re2Inst{op: re2Capture, out: a.begin})
	closing := c.add(re2Inst{op: re2Capture})
	c.fill(a.end, closing)
	return re2Frag{begin: open, end: []re2Hole{{id: closing}}, nullable: a.nullable}
}

// class compiles a character class (Go's range pairs) as RE2 in Latin-1 mode does: clipped to
// \xff, abutting ranges merged, ranges inside A-Z left out when the class folds ASCII case (has
// both cases of every letter it has), one ByteRange per range joined by Alts.
func (c *re2Compiler) class(rs []rune) re2Frag {
	var in [256]bool
	for i := 0; i+1 < len(rs); i += 2 {
		for r := rs[i]; r <= rs[i+1] && r <= 0xff; r++ {
			in[r] = true
		}
	}
	folds := true
	for l := 'a'; l <= 'z'; l++ {
		folds = folds && in[l] == in[l-'a'+'A']
	}
	f := re2Frag{}
	for lo := 0; lo < 256; lo++ {
		if !in[lo] || (lo > 0 && in[lo-1]) {
			continue
		}
		hi := lo
		for hi < 255 && in[hi+1] {
			hi++
		}
		if folds && lo >= 'A' && hi <= 'Z' {
			continue
		}
		id := c.add(re2Inst{op: re2ByteRange, lo: byte(lo), hi: byte(hi)})
		if f.begin == 0 {
			f.begin = id
		} else {
			f.begin = c.add(re2Inst{op: re2Alt, out: f.begin, out1: id})
		}
		f.end = append(f.end, re2Hole{id: id})
	}
	return f
}

// compile compiles simplified expression re, children before their parent as RE2's walker does
// (the order of instructions decides which become roots in Flatten).
func (c *re2Compiler) compile(re *syntax.Regexp) re2Frag {
	nongreedy := re.Flags&syntax.NonGreedy != 0
	switch re.Op {
	case syntax.OpNoMatch:
		return re2Frag{}
	case syntax.OpEmptyMatch:
		return c.single(re2Nop, 0, 0, true)
	case syntax.OpLiteral:
		if len(re.Rune) == 0 {
			return c.single(re2Nop, 0, 0, true)
		}
		var f re2Frag
		first := true
		for _, r := range re.Rune {
			// Latin-1 RE2 reads each byte of a UTF-8 character as a character of its own.
			var b [utf8.UTFMax]byte
			for _, x := range b[:utf8.EncodeRune(b[:], r)] {
				g := c.single(re2ByteRange, x, x, false)
				if first {
					f, first = g, false
				} else {
					f = c.cat(f, g)
				}
			}
		}
		return f
	case syntax.OpCharClass:
		return c.class(re.Rune)
	case syntax.OpAnyCharNotNL:
		return c.class([]rune{0, '\n' - 1, '\n' + 1, 0xff})
	case syntax.OpAnyChar:
		return c.class([]rune{0, 0xff})
	case syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText, syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return c.single(re2EmptyWidth, 0, 0, true)
	case syntax.OpCapture:
		return c.capture(c.compile(re.Sub[0]))
	case syntax.OpStar:
		return c.star(c.compile(re.Sub[0]), nongreedy)
	case syntax.OpPlus:
		return c.plus(c.compile(re.Sub[0]), nongreedy)
	case syntax.OpQuest:
		return c.quest(c.compile(re.Sub[0]), nongreedy)
	case syntax.OpRepeat:
		return c.compile(re2SimplifyWalk(re))
	case syntax.OpConcat, syntax.OpAlternate:
		if len(re.Sub) == 0 {
			return c.single(re2Nop, 0, 0, true)
		}
		subs := make([]re2Frag, len(re.Sub))
		for i, s := range re.Sub {
			subs[i] = c.compile(s)
		}
		f := subs[0]
		for _, g := range subs[1:] {
			if re.Op == syntax.OpConcat {
				f = c.cat(f, g)
			} else {
				f = c.alt(f, g)
			}
		}
		return f
	}
	return re2Frag{}
}

// re2RequiredPrefix returns what RE2 compiles of parsed expression re when re begins with ^ and
// a literal (RE2 sets the literal aside and matches it before the program): the rest, or re.
func re2RequiredPrefix(re *syntax.Regexp) *syntax.Regexp {
	if re.Op != syntax.OpConcat {
		return re
	}
	i := 0
	for i < len(re.Sub) && re.Sub[i].Op == syntax.OpBeginText {
		i++
	}
	if i == 0 || i >= len(re.Sub) || re.Sub[i].Op != syntax.OpLiteral {
		return re
	}
	switch rest := re.Sub[i+1:]; len(rest) {
	case 0:
		return &syntax.Regexp{Op: syntax.OpEmptyMatch}
	case 1:
		return rest[0]
	default:
		return &syntax.Regexp{Op: syntax.OpConcat, Flags: re.Flags, Sub: rest}
	}
}

// re2StripAnchor returns re without its leading ^ (last $ when end), which RE2 removes and
// records as the program's anchor, looking through concatenations and captures down to depth 4;
// ok is false when re is not anchored so. re is not changed.
func re2StripAnchor(re *syntax.Regexp, end bool, depth int) (*syntax.Regexp, bool) {
	if depth >= 4 {
		return re, false
	}
	switch re.Op {
	case syntax.OpConcat:
		if len(re.Sub) == 0 {
			return re, false
		}
		i := 0
		if end {
			i = len(re.Sub) - 1
		}
		s, ok := re2StripAnchor(re.Sub[i], end, depth+1)
		if !ok {
			return re, false
		}
		n := *re
		n.Sub = append([]*syntax.Regexp(nil), re.Sub...)
		n.Sub[i] = s
		return &n, true
	case syntax.OpCapture:
		s, ok := re2StripAnchor(re.Sub[0], end, depth+1)
		if !ok {
			return re, false
		}
		n := *re
		n.Sub = []*syntax.Regexp{s}
		return &n, true
	case syntax.OpBeginText:
		if !end {
			return &syntax.Regexp{Op: syntax.OpEmptyMatch}, true
		}
	case syntax.OpEndText:
		if end {
			return &syntax.Regexp{Op: syntax.OpEmptyMatch}, true
		}
	}
	return re, false
}

func re2ProgramSize(p *syntax.Regexp) int {
	re := re2Simplify(re2RequiredPrefix(re2FactorEmptyWidth(re2Squash(p))))
	re, anchored := re2StripAnchor(re, false, 0)
	re, _ = re2StripAnchor(re, true, 0)
	c := &re2Compiler{inst: []re2Inst{{op: re2Fail}}}
	all := c.cat(c.compile(re), re2Frag{begin: c.add(re2Inst{op: re2Match})})
	start := all.begin
	if !anchored {
		dot := c.single(re2ByteRange, 0, 0xff, false)
		all = c.cat(c.star(dot, true), all)
	}
	if start == 0 && all.begin == 0 {
		return 1 // nothing can match: the Fail instruction only
	}
	c.optimize(start)
	return c.flatSize(all.begin, start)
}

// reach lists the instructions reachable from start, start first.
func (c *re2Compiler) reach(start int, next func(id int) []int) []int {
	seen := map[int]bool{}
	var order []int
	queue := []int{start}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		if id == 0 || seen[id] {
			continue
		}
		seen[id] = true
		order = append(order, id)
		queue = append(queue, next(id)...)
	}
	return order
}

// optimize is RE2's Prog::Optimize from start: successors skip Nops, and an Alt looping over
// any byte beside a match becomes AltMatch.
func (c *re2Compiler) optimize(start int) {
	skip := func(j int) int {
		for j != 0 && c.inst[j].op == re2Nop {
			j = c.inst[j].out
		}
		return j
	}
	c.reach(start, func(id int) []int {
		in := &c.inst[id]
		in.out = skip(in.out)
		if in.op == re2Alt {
			in.out1 = skip(in.out1)
			return []int{in.out, in.out1}
		}
		return []int{in.out}
	})
	isMatch := func(j int) bool {
		for {
			switch c.inst[j].op {
			case re2Capture, re2Nop:
				j = c.inst[j].out
			case re2Match:
				return true
			default:
				return false
			}
		}
	}
	anyByteTo := func(j, id int) bool {
		in := c.inst[j]
		return in.op == re2ByteRange && in.out == id && in.lo == 0 && in.hi == 0xff
	}
	c.reach(start, func(id int) []int {
		in := &c.inst[id]
		if in.op != re2Alt {
			return []int{in.out}
		}
		if (anyByteTo(in.out, id) && isMatch(in.out1)) || (isMatch(in.out) && anyByteTo(in.out1, id)) {
			in.op = re2AltMatch
		}
		return []int{in.out, in.out1}
	})
}

// flatSize is the size of the program after RE2's Prog::Flatten: the instructions are cut into
// trees at "roots" (Fail, the starts, every successor of a ByteRange, Capture or EmptyWidth, and
// every Alt with a predecessor outside its root's tree), and each tree becomes a list of its
// leaves, with a Nop for each other root it reaches.
func (c *re2Compiler) flatSize(unanchored, start int) int {
	isRoot := map[int]bool{}
	var roots []int
	mark := func(id int) {
		if !isRoot[id] {
			isRoot[id] = true
			roots = append(roots, id)
		}
	}
	mark(0)
	mark(unanchored)
	mark(start)
	preds := map[int][]int{}
	seen := map[int]bool{}
	for stack := []int{unanchored}; len(stack) > 0; {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for !seen[id] {
			seen[id] = true
			in := c.inst[id]
			switch in.op {
			case re2Alt, re2AltMatch:
				preds[in.out] = append(preds[in.out], id)
				preds[in.out1] = append(preds[in.out1], id)
				stack = append(stack, in.out1)
				id = in.out
				continue
			case re2ByteRange, re2Capture, re2EmptyWidth:
				mark(in.out)
				id = in.out
				continue
			case re2Nop:
				id = in.out
				continue
			}
		}
	}
	// tree floods from root through Alts and Nops, stopping at leaves and other roots; visit is
	// called once per instruction reached.
	tree := func(root int, visit func(id int) bool) {
		seen := map[int]bool{}
		for stack := []int{root}; len(stack) > 0; {
			id := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for !seen[id] {
				seen[id] = true
				if !visit(id) {
					break
				}
				in := c.inst[id]
				if in.op == re2Alt || in.op == re2AltMatch {
					stack = append(stack, in.out1)
				}
				id = in.out
			}
		}
	}
	sorted := append([]int(nil), roots...)
	slices.Sort(sorted)
	for i := len(sorted) - 1; i > 0; i-- {
		root := sorted[i]
		if root == unanchored || root == start {
			continue
		}
		reached := map[int]bool{}
		var order []int
		tree(root, func(id int) bool {
			reached[id] = true
			order = append(order, id)
			if id != root && isRoot[id] {
				return false
			}
			op := c.inst[id].op
			return op == re2Alt || op == re2AltMatch || op == re2Nop
		})
		for _, id := range order {
			for _, p := range preds[id] {
				if !reached[p] {
					mark(id)
				}
			}
		}
	}
	size := 0
	for _, root := range roots {
		tree(root, func(id int) bool {
			if id != root && isRoot[id] {
				size++ // a Nop to the other list
				return false
			}
			switch c.inst[id].op {
			case re2AltMatch:
				size++
				return true
			case re2Alt, re2Nop:
				return true
			}
			size++
			return false
		})
	}
	return size
}

// re2Squash applies what RE2's parser does and Go's does not: a repeat of a repeat with the same
// flags ("(?:a*)+") is one repeat, the same op or else a star.
func re2Squash(re *syntax.Regexp) *syntax.Regexp {
	subs, changed := re2MapSubs(re, re2Squash)
	if isRepeatOp(re.Op) && re.Op != syntax.OpRepeat {
		if s := subs[0]; isRepeatOp(s.Op) && s.Op != syntax.OpRepeat && s.Flags == re.Flags {
			if s.Op == re.Op || s.Op == syntax.OpStar {
				return s
			}
			return &syntax.Regexp{Op: syntax.OpStar, Flags: s.Flags, Sub: s.Sub}
		}
	}
	return re2WithSubs(re, subs, changed)
}

// re2Simplify simplifies as RE2's Regexp::Simplify does: first repeats of one atom next to each
// other are merged (CoalesceWalker: "a+a*" is a{1,}, "a*ab" is a{1,}b), then counted repeats are
// spelled out (re2SimplifyWalk).
func re2Simplify(re *syntax.Regexp) *syntax.Regexp {
	return re2SimplifyWalk(re2Coalesce(re))
}

func isRepeatOp(op syntax.Op) bool {
	return op == syntax.OpStar || op == syntax.OpPlus || op == syntax.OpQuest || op == syntax.OpRepeat
}

// re2MapSubs applies f to the subexpressions of re; changed reports whether any changed.
func re2MapSubs(re *syntax.Regexp, f func(*syntax.Regexp) *syntax.Regexp) ([]*syntax.Regexp, bool) {
	subs := make([]*syntax.Regexp, len(re.Sub))
	changed := false
	for i, s := range re.Sub {
		subs[i] = f(s)
		changed = changed || subs[i] != s
	}
	return subs, changed
}

// re2WithSubs is re with subexpressions subs (a copy when changed; re is never modified).
func re2WithSubs(re *syntax.Regexp, subs []*syntax.Regexp, changed bool) *syntax.Regexp {
	if !changed {
		return re
	}
	n := *re
	n.Sub, n.Sub0 = subs, [1]*syntax.Regexp{}
	return &n
}

// re2Atom reports whether re is what RE2 coalesces repeats of: one literal character, a class or
// any character.
func re2Atom(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpLiteral:
		return len(re.Rune) == 1
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return true
	}
	return false
}

func re2CanCoalesce(r1, r2 *syntax.Regexp) bool {
	if !isRepeatOp(r1.Op) || !re2Atom(r1.Sub[0]) {
		return false
	}
	a := r1.Sub[0]
	switch {
	case isRepeatOp(r2.Op) && a.Equal(r2.Sub[0]) && r1.Flags&syntax.NonGreedy == r2.Flags&syntax.NonGreedy:
		return true
	case a.Equal(r2):
		return true
	}
	return a.Op == syntax.OpLiteral && r2.Op == syntax.OpLiteral && len(r2.Rune) > 1 && r2.Rune[0] == a.Rune[0] &&
		a.Flags&syntax.FoldCase == r2.Flags&syntax.FoldCase
}

// re2DoCoalesce merges r2 into repeat r1: the merged repeat, and what is left of r2 (an empty
// match when nothing).
func re2DoCoalesce(r1, r2 *syntax.Regexp) (*syntax.Regexp, *syntax.Regexp) {
	lo, hi := 0, -1
	switch r1.Op {
	case syntax.OpPlus:
		lo = 1
	case syntax.OpQuest:
		hi = 1
	case syntax.OpRepeat:
		lo, hi = r1.Min, r1.Max
	}
	add := func(n, m int) {
		lo += n
		if hi != -1 {
			if m == -1 {
				hi = -1
			} else {
				hi += m
			}
		}
	}
	rest := &syntax.Regexp{Op: syntax.OpEmptyMatch}
	switch {
	case r2.Op == syntax.OpStar:
		hi = -1
	case r2.Op == syntax.OpPlus:
		lo, hi = lo+1, -1
	case r2.Op == syntax.OpQuest:
		add(0, 1)
	case r2.Op == syntax.OpRepeat:
		add(r2.Min, r2.Max)
	case r2.Op == syntax.OpLiteral && len(r2.Rune) > 1:
		i := 1
		for i < len(r2.Rune) && r2.Rune[i] == r2.Rune[0] {
			i++
		}
		add(i, i)
		if i < len(r2.Rune) {
			rest = &syntax.Regexp{Op: syntax.OpLiteral, Flags: r2.Flags, Rune: append([]rune(nil), r2.Rune[i:]...)}
		}
	default:
		add(1, 1)
	}
	rep := &syntax.Regexp{Op: syntax.OpRepeat, Flags: r1.Flags, Min: lo, Max: hi, Sub: []*syntax.Regexp{r1.Sub[0]}}
	if rest.Op == syntax.OpEmptyMatch {
		return rest, rep
	}
	return rep, rest
}

// re2Coalesce is RE2's CoalesceWalker: in each concatenation (children first), a repeat of an
// atom followed by a repeat of it, by it, or by a literal string starting with it becomes one
// repeat; the empty matches left are dropped.
func re2Coalesce(re *syntax.Regexp) *syntax.Regexp {
	subs, changed := re2MapSubs(re, re2Coalesce)
	if re.Op != syntax.OpConcat {
		return re2WithSubs(re, subs, changed)
	}
	merged := false
	for i := 0; i+1 < len(subs); i++ {
		if re2CanCoalesce(subs[i], subs[i+1]) {
			subs[i], subs[i+1] = re2DoCoalesce(subs[i], subs[i+1])
			merged = true
		}
	}
	if merged {
		subs = slices.DeleteFunc(subs, func(s *syntax.Regexp) bool { return s.Op == syntax.OpEmptyMatch })
		changed = true
	}
	return re2WithSubs(re, subs, changed)
}

// re2SimplifyWalk is RE2's SimplifyWalker: a repeat of an empty match is that empty match, a
// repeat of the same repeat with the same flags is the inner one, x{n,m} becomes n copies of x
// then m-n nested x? (concatenations nested as RE2 builds them, which decides how deep RE2
// looks for ^ and $), a repeat of empty-width assertions at most once, and a class with nothing
// up to \xff (RE2 in Latin-1) matches nothing.
func re2SimplifyWalk(re *syntax.Regexp) *syntax.Regexp {
	switch re.Op {
	case syntax.OpCapture, syntax.OpConcat, syntax.OpAlternate:
		subs, changed := re2MapSubs(re, re2SimplifyWalk)
		return re2WithSubs(re, subs, changed)
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		sub := re2SimplifyWalk(re.Sub[0])
		if sub.Op == syntax.OpEmptyMatch || (sub.Op == re.Op && sub.Flags == re.Flags) {
			return sub
		}
		return re2WithSubs(re, []*syntax.Regexp{sub}, sub != re.Sub[0])
	case syntax.OpRepeat:
		sub := re2SimplifyWalk(re.Sub[0])
		if sub.Op == syntax.OpEmptyMatch {
			return sub
		}
		return re2SimplifyRepeat(sub, re.Min, re.Max, re.Flags)
	case syntax.OpCharClass:
		if len(re.Rune) == 0 || re.Rune[0] > 0xff {
			return &syntax.Regexp{Op: syntax.OpNoMatch, Flags: re.Flags}
		}
	}
	return re
}

// re2Repeat is RE2's Regexp::Star, Plus and Quest constructors: op of sub, where a repeat of a
// repeat with the same flags is the inner one (the same op) or a star.
func re2Repeat(op syntax.Op, sub *syntax.Regexp, flags syntax.Flags) *syntax.Regexp {
	if sub.Flags == flags && (sub.Op == syntax.OpStar || sub.Op == syntax.OpPlus || sub.Op == syntax.OpQuest) {
		if sub.Op == op || sub.Op == syntax.OpStar {
			return sub
		}
		return &syntax.Regexp{Op: syntax.OpStar, Flags: flags, Sub: sub.Sub}
	}
	return &syntax.Regexp{Op: op, Flags: flags, Sub: []*syntax.Regexp{sub}}
}

// re2Concat is RE2's Regexp::Concat: one sub is itself.
func re2Concat(subs []*syntax.Regexp, flags syntax.Flags) *syntax.Regexp {
	if len(subs) == 1 {
		return subs[0]
	}
	return &syntax.Regexp{Op: syntax.OpConcat, Flags: flags, Sub: subs}
}

func re2SimplifyRepeat(x *syntax.Regexp, lo, hi int, flags syntax.Flags) *syntax.Regexp {
	if isEmptyWidthOp(x) || ((x.Op == syntax.OpConcat || x.Op == syntax.OpAlternate) && !slices.ContainsFunc(x.Sub, func(s *syntax.Regexp) bool { return !isEmptyWidthOp(s) })) {
		lo = min(lo, 1)
		if hi != -1 {
			hi = min(hi, 1)
		}
	}
	if hi == -1 {
		switch lo {
		case 0:
			return re2Repeat(syntax.OpStar, x, flags)
		case 1:
			return re2Repeat(syntax.OpPlus, x, flags)
		}
		subs := slices.Repeat([]*syntax.Regexp{x}, lo-1)
		return re2Concat(append(subs, re2Repeat(syntax.OpPlus, x, flags)), flags)
	}
	if lo == 0 && hi == 0 {
		return &syntax.Regexp{Op: syntax.OpEmptyMatch, Flags: flags}
	}
	if lo == 1 && hi == 1 {
		return x
	}
	var out *syntax.Regexp
	if lo > 0 {
		out = re2Concat(slices.Repeat([]*syntax.Regexp{x}, lo), flags)
	}
	if hi > lo {
		suf := re2Repeat(syntax.OpQuest, x, flags)
		for i := lo + 1; i < hi; i++ {
			suf = re2Repeat(syntax.OpQuest, &syntax.Regexp{Op: syntax.OpConcat, Flags: flags, Sub: []*syntax.Regexp{x, suf}}, flags)
		}
		if out == nil {
			return suf
		}
		out = &syntax.Regexp{Op: syntax.OpConcat, Flags: flags, Sub: []*syntax.Regexp{out, suf}}
	}
	if out == nil {
		return &syntax.Regexp{Op: syntax.OpNoMatch, Flags: flags}
	}
	return out
}

func isEmptyWidthOp(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText, syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return true
	}
	return false
}

// re2Leading is the first piece of alternation branch re (nil for an empty match): RE2's
// Regexp::LeadingRegexp.
func re2Leading(re *syntax.Regexp) *syntax.Regexp {
	switch {
	case re.Op == syntax.OpEmptyMatch:
		return nil
	case re.Op == syntax.OpConcat && len(re.Sub) >= 2:
		if re.Sub[0].Op == syntax.OpEmptyMatch {
			return nil
		}
		return re.Sub[0]
	}
	return re
}

// re2RemoveLeading is branch re without its first piece (RE2's Regexp::RemoveLeadingRegexp).
func re2RemoveLeading(re *syntax.Regexp) *syntax.Regexp {
	switch {
	case re.Op == syntax.OpEmptyMatch:
		return re
	case re.Op == syntax.OpConcat && len(re.Sub) == 2:
		return re.Sub[1]
	case re.Op == syntax.OpConcat && len(re.Sub) > 2:
		return &syntax.Regexp{Op: syntax.OpConcat, Flags: re.Flags, Sub: re.Sub[1:]}
	}
	return &syntax.Regexp{Op: syntax.OpEmptyMatch, Flags: re.Flags}
}

// re2LeadingString is the literal text branch re starts with, through nested concatenations
// (RE2's Regexp::LeadingString), and whether it folds case.
func re2LeadingString(re *syntax.Regexp) ([]rune, bool) {
	for re.Op == syntax.OpConcat && len(re.Sub) > 0 {
		re = re.Sub[0]
	}
	if re.Op != syntax.OpLiteral {
		return nil, false
	}
	return re.Rune, re.Flags&syntax.FoldCase != 0
}

// re2RemoveLeadingString is branch re without its first n literal runes, concatenations left
// empty in front dropped (RE2's Regexp::RemoveLeadingString).
func re2RemoveLeadingString(re *syntax.Regexp, n int) *syntax.Regexp {
	if re.Op == syntax.OpConcat && len(re.Sub) > 0 {
		first := re2RemoveLeadingString(re.Sub[0], n)
		if first.Op != syntax.OpEmptyMatch {
			return &syntax.Regexp{Op: syntax.OpConcat, Flags: re.Flags, Sub: append([]*syntax.Regexp{first}, re.Sub[1:]...)}
		}
		if len(re.Sub) == 2 {
			return re.Sub[1]
		}
		return &syntax.Regexp{Op: syntax.OpConcat, Flags: re.Flags, Sub: re.Sub[1:]}
	}
	if re.Op != syntax.OpLiteral || n >= len(re.Rune) {
		return &syntax.Regexp{Op: syntax.OpEmptyMatch, Flags: re.Flags}
	}
	return &syntax.Regexp{Op: syntax.OpLiteral, Flags: re.Flags, Rune: re.Rune[n:]}
}

// re2FactorLead reports whether RE2 factors out a common first piece lead (round 2): an
// empty-width assertion, a class, any character, or a fixed repeat of a literal character or
// of those.
func re2FactorLead(lead *syntax.Regexp) bool {
	switch {
	case isEmptyWidthOp(lead), lead.Op == syntax.OpCharClass, lead.Op == syntax.OpAnyChar, lead.Op == syntax.OpAnyCharNotNL:
		return true
	case lead.Op == syntax.OpRepeat && lead.Min == lead.Max:
		return re2Atom(lead.Sub[0])
	}
	return false
}

// re2Factor factors alternation branches subs as RE2's parser does (FactorAlternation): runs of
// branches with a common literal prefix (round 1) or a common first piece (round 2) become the
// prefix then the alternation of the rests, itself factored; runs of single characters and
// classes merge into one class (round 3); runs of empty matches into one (round 4).
func re2Factor(subs []*syntax.Regexp, flags syntax.Flags) []*syntax.Regexp {
	alt := func(bs []*syntax.Regexp) *syntax.Regexp {
		if len(bs) == 1 {
			return bs[0]
		}
		return &syntax.Regexp{Op: syntax.OpAlternate, Flags: flags, Sub: bs}
	}
	var r1 []*syntax.Regexp
	for i := 0; i < len(subs); {
		str, fold := re2LeadingString(subs[i])
		n, j := len(str), i+1
		for ; n > 0 && j < len(subs); j++ {
			s, f := re2LeadingString(subs[j])
			same := 0
			for same < n && same < len(s) && s[same] == str[same] {
				same++
			}
			if f != fold || same == 0 {
				break
			}
			n = same
		}
		if j-i < 2 || n == 0 {
			r1 = append(r1, subs[i])
			i++
			continue
		}
		rests := make([]*syntax.Regexp, 0, j-i)
		for _, b := range subs[i:j] {
			rests = append(rests, re2RemoveLeadingString(b, n))
		}
		var lf syntax.Flags
		if fold {
			lf = syntax.FoldCase
		}
		prefix := &syntax.Regexp{Op: syntax.OpLiteral, Flags: lf, Rune: str[:n]}
		r1 = append(r1, &syntax.Regexp{Op: syntax.OpConcat, Flags: flags, Sub: []*syntax.Regexp{prefix, alt(re2Factor(rests, flags))}})
		i = j
	}
	var r2 []*syntax.Regexp
	for i := 0; i < len(r1); {
		lead := re2Leading(r1[i])
		j := i + 1
		for lead != nil && re2FactorLead(lead) && j < len(r1) {
			if l := re2Leading(r1[j]); l == nil || !lead.Equal(l) {
				break
			}
			j++
		}
		if j-i < 2 {
			r2 = append(r2, r1[i])
			i++
			continue
		}
		rests := make([]*syntax.Regexp, 0, j-i)
		for _, b := range r1[i:j] {
			rests = append(rests, re2RemoveLeading(b))
		}
		r2 = append(r2, &syntax.Regexp{Op: syntax.OpConcat, Flags: flags, Sub: []*syntax.Regexp{lead, alt(re2Factor(rests, flags))}})
		i = j
	}
	var out []*syntax.Regexp
	for i := 0; i < len(r2); {
		char := func(re *syntax.Regexp) bool {
			return (re.Op == syntax.OpLiteral && len(re.Rune) == 1) || re.Op == syntax.OpCharClass
		}
		j := i + 1
		for char(r2[i]) && j < len(r2) && char(r2[j]) {
			j++
		}
		if j-i >= 2 {
			var rs []rune
			for _, b := range r2[i:j] {
				rs = append(rs, re2ClassRanges(b)...)
			}
			out = append(out, &syntax.Regexp{Op: syntax.OpCharClass, Flags: flags, Rune: re2CleanRanges(rs)})
			i = j
			continue
		}
		if r2[i].Op == syntax.OpEmptyMatch && len(out) > 0 && out[len(out)-1].Op == syntax.OpEmptyMatch {
			i++
			continue
		}
		out = append(out, r2[i])
		i++
	}
	return out
}

// re2ClassRanges is the ranges a single character (with its case partners under (?i)) or a
// class matches.
func re2ClassRanges(re *syntax.Regexp) []rune {
	if re.Op == syntax.OpCharClass {
		return re.Rune
	}
	r := re.Rune[0]
	rs := []rune{r, r}
	if re.Flags&syntax.FoldCase != 0 {
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			rs = append(rs, f, f)
		}
	}
	return rs
}

// re2CleanRanges sorts range pairs rs and merges overlapping and abutting ones.
func re2CleanRanges(rs []rune) []rune {
	pairs := make([][2]rune, 0, len(rs)/2)
	for i := 0; i+1 < len(rs); i += 2 {
		pairs = append(pairs, [2]rune{rs[i], rs[i+1]})
	}
	slices.SortFunc(pairs, func(a, b [2]rune) int { return int(a[0] - b[0]) })
	var out []rune
	for _, p := range pairs {
		if n := len(out); n > 0 && p[0] <= out[n-1]+1 {
			out[n-1] = max(out[n-1], p[1])
			continue
		}
		out = append(out, p[0], p[1])
	}
	return out
}

// re2FactorEmptyWidth factors, as RE2's parser does and Go's does not, a leading empty-width
// assertion shared by consecutive branches of an alternation: "^/a|^/b" is ^ then the
// alternation of the rest, which RE2 factors again (re2Factor). RE2 keeps the result a
// concatenation of two, so no required prefix is set aside and the $ of the branches stays.
// Go's parser has done the rest of the factoring already.
func re2FactorEmptyWidth(re *syntax.Regexp) *syntax.Regexp {
	subs, changed := re2MapSubs(re, re2FactorEmptyWidth)
	if re.Op != syntax.OpAlternate {
		return re2WithSubs(re, subs, changed)
	}
	var out []*syntax.Regexp
	for i := 0; i < len(subs); {
		lead := re2Leading(subs[i])
		j := i + 1
		for lead != nil && isEmptyWidthOp(lead) && j < len(subs) {
			if l := re2Leading(subs[j]); l == nil || !lead.Equal(l) {
				break
			}
			j++
		}
		if j-i < 2 {
			out = append(out, subs[i])
			i = j
			continue
		}
		rests := make([]*syntax.Regexp, 0, j-i)
		for _, b := range subs[i:j] {
			rests = append(rests, re2RemoveLeading(b))
		}
		inner := re2Factor(rests, re.Flags)
		in := inner[0]
		if len(inner) > 1 {
			in = &syntax.Regexp{Op: syntax.OpAlternate, Flags: re.Flags, Sub: inner}
		}
		out = append(out, &syntax.Regexp{Op: syntax.OpConcat, Flags: re.Flags, Sub: []*syntax.Regexp{lead, in}})
		changed = true
		i = j
	}
	if len(out) == 1 {
		return out[0]
	}
	return re2WithSubs(re, out, changed)
}
