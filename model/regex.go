package model

import (
	"errors"
	"fmt"
	"regexp/syntax"
	"strings"
	"unicode"
	"unicode/utf8"
)

// RegexProgramLimit is the largest RE2 program size Envoy takes for a regular expression:
// Envoy refuses a regex whose RE2 program is larger than the runtime value
// re2.max_program_size.error_level (default 100; aether's bootstrap does not change it), and
// with it the whole route table that holds it. The model computes the size (RE2ProgramSize) and
// refuses a route regex over the limit.
const RegexProgramLimit = 100

// regexProblem says why Envoy would refuse regular expression re, or read it otherwise than the
// RE2 syntax says, or "" when Envoy takes it as written. Envoy compiles route regexes with RE2
// matching bytes (Latin-1, measured on Envoy 1.40: "." matches one byte of "é", \x{100} is
// refused), so besides RE2 syntax (Go's regexp/syntax with Perl flags, the grammar RE2 shares:
// no lookaround, backreferences or \C) it refuses:
//   - the empty expression (Envoy's RegexMatcher.regex has min_len 1);
//   - a non-ASCII character: Envoy would match its UTF-8 bytes one by one, so "é+" repeats the
//     last byte and "[éè]" is a class of three bytes;
//   - an escape above \x7F (\xE9, \x{100}, \351), for the same reason;
//   - a character class holding some but not all non-ASCII characters (\pL, \p{Greek}, [^\pN]);
//     a negated ASCII class ([^/], \D, ".") matches every non-ASCII byte, as it should;
//   - an alternation with the same branch twice ("^a|^a|"), which says nothing and which RE2
//     factors otherwise than RE2ProgramSize counts;
//   - a program over RegexProgramLimit (RE2ProgramSize).
func regexProblem(re string) string {
	if re == "" {
		return "an empty expression: want at least one character"
	}
	p, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		var se *syntax.Error
		if errors.As(err, &se) {
			return fmt.Sprintf("not an RE2 expression: %s: %s", se.Code, quoteValue(se.Expr))
		}
		return "not an RE2 expression: " + err.Error()
	}
	const bytes = "Envoy matches bytes (RE2 in Latin-1 mode), not UTF-8 characters"
	if i := strings.IndexFunc(re, func(r rune) bool { return r >= utf8.RuneSelf }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(re[i:])
		return fmt.Sprintf("non-ASCII character %q: %s; want ASCII only", r, bytes)
	}
	if e := highEscape(re); e != "" {
		return fmt.Sprintf("escape %s: %s, so an escape above \\x7F is not that character; want ASCII only", e, bytes)
	}
	if c := partialClass(p); c != "" {
		return fmt.Sprintf("character class %s: %s; a class may hold ASCII characters only (a negated one matches every non-ASCII byte)", quoteValue(c), bytes)
	}
	if b := repeatedBranch(re); b != "" {
		return fmt.Sprintf("alternation repeats the branch %s: drop the repeat", quoteValue(b))
	}
	if n := re2ProgramSize(p); n > RegexProgramLimit {
		return fmt.Sprintf("RE2 program size %d is over Envoy's limit of %d (runtime re2.max_program_size.error_level): simplify the expression", n, RegexProgramLimit)
	}
	return ""
}

// highEscape returns the first escape of re (which parses) standing for a character above \x7F:
// \xHH, \x{H...} or octal \NNN; "" when there is none. Text between \Q and \E is literal.
func highEscape(re string) string {
	for i := 0; i+1 < len(re); i++ {
		if re[i] != '\\' {
			continue
		}
		switch c := re[i+1]; {
		case c == 'Q':
			end := strings.Index(re[i+2:], `\E`)
			if end < 0 {
				return ""
			}
			i += 2 + end + 1
		case c == 'x':
			j, v := i+2, 0
			if j < len(re) && re[j] == '{' {
				for j++; j < len(re) && re[j] != '}'; j++ {
					v = min(v*16+hexDigit(re[j]), unicode.MaxRune+1)
				}
				j++
			} else {
				for end := j + 2; j < end && j < len(re); j++ {
					v = v*16 + hexDigit(re[j])
				}
			}
			if v >= utf8.RuneSelf {
				return re[i:min(j, len(re))]
			}
			i = j - 1
		case c >= '0' && c <= '7':
			// Octal as RE2 and Go read it: \0 with up to two more digits, \1-\7 with one or two
			// more (a lone \1-\7 is a backreference, which does not parse).
			j, v := i+2, int(c-'0')
			for ; j < i+4 && j < len(re) && re[j] >= '0' && re[j] <= '7'; j++ {
				v = v*8 + int(re[j]-'0')
			}
			if v >= utf8.RuneSelf {
				return re[i:j]
			}
			i = j - 1
		default:
			i++
		}
	}
	return ""
}

func hexDigit(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return 0
}

// Go's (?i) adds these to the classes of k and s; Envoy folds ASCII only, which is what a route
// means, so they count neither way.
const (
	kelvinSign = 0x212a
	longS      = 0x17f
)

// partialClass returns the first character class of parsed expression re holding some but not
// all non-ASCII characters (as text), "" when there is none.
func partialClass(re *syntax.Regexp) string {
	if re.Op == syntax.OpCharClass {
		const all = unicode.MaxRune - utf8.RuneSelf + 1 - 2
		n := 0
		for i := 0; i+1 < len(re.Rune); i += 2 {
			lo, hi := max(re.Rune[i], utf8.RuneSelf), re.Rune[i+1]
			if lo > hi {
				continue
			}
			n += int(hi - lo + 1)
			for _, x := range []rune{kelvinSign, longS} {
				if lo <= x && x <= hi {
					n--
				}
			}
		}
		if n != 0 && n != all {
			return re.String()
		}
	}
	for _, s := range re.Sub {
		if c := partialClass(s); c != "" {
			return c
		}
	}
	return ""
}

// quoteValue quotes v for a message (Go syntax, so control characters show escaped), cut to
// 128 bytes with "..." when longer: a message names the value without repeating a long one.
func quoteValue(v string) string {
	const max = 128
	if len(v) <= max {
		return fmt.Sprintf("%q", v)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return fmt.Sprintf("%q...", v[:cut])
}

// repeatedBranch returns a branch that an alternation of expression re (which parses) holds
// twice, as written, or "" when none does. Branches are compared as parsed, under the flags in
// force ("b|[b]" and "(?i:a|A)" repeat a branch), each group's branches split from the text,
// since Go's parser merges repeats ("b|b" is b) where RE2's keeps them.
func repeatedBranch(re string) string {
	type branch struct{ flags, text string }
	type open struct {
		start             int
		flags, startFlags string
		branches          []branch
	}
	var stack []open
	var branches []branch
	start, flags, startFlags := 0, "", ""
	check := func(bs []branch) string {
		var parsed []*syntax.Regexp
		for _, b := range bs {
			p, err := syntax.Parse(b.flags+b.text, syntax.Perl)
			if err != nil {
				continue
			}
			for _, q := range parsed {
				if q.Equal(p) {
					return b.text
				}
			}
			parsed = append(parsed, p)
		}
		return ""
	}
	for i := 0; i < len(re); i++ {
		switch re[i] {
		case '\\':
			if i+1 < len(re) && re[i+1] == 'Q' {
				end := strings.Index(re[i+2:], `\E`)
				if end < 0 {
					i = len(re)
				} else {
					i += 2 + end + 1
				}
			} else {
				i++
			}
		case '[':
			i++
			if i < len(re) && re[i] == '^' {
				i++
			}
			if i < len(re) && re[i] == ']' {
				i++
			}
			for ; i < len(re) && re[i] != ']'; i++ {
				switch {
				case re[i] == '\\':
					i++
				case strings.HasPrefix(re[i:], "[:"):
					if end := strings.Index(re[i+2:], ":]"); end >= 0 {
						i += 2 + end + 1
					}
				}
			}
		case '(':
			j, inner := i+1, flags
			switch {
			case strings.HasPrefix(re[j:], "?P<") || strings.HasPrefix(re[j:], "?<"):
				j += strings.IndexByte(re[j:], '>') + 1
			case strings.HasPrefix(re[j:], "?"):
				end := strings.IndexAny(re[j:], ":)")
				if re[j+end] == ')' {
					flags += re[i : j+end+1] // a flag setting such as (?i): in force to the group's end
					i = j + end
					continue
				}
				if end > 1 {
					inner += "(" + re[j:j+end] + ")" // (?i:...)
				}
				j += end + 1
			}
			stack = append(stack, open{start: start, flags: flags, startFlags: startFlags, branches: branches})
			start, flags, startFlags, branches = j, inner, inner, nil
			i = j - 1
		case '|':
			branches = append(branches, branch{startFlags, re[start:i]})
			start, startFlags = i+1, flags
		case ')':
			if b := check(append(branches, branch{startFlags, re[start:i]})); b != "" {
				return b
			}
			o := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			start, flags, startFlags, branches = o.start, o.flags, o.startFlags, o.branches
		}
	}
	return check(append(branches, branch{startFlags, re[start:]}))
}
