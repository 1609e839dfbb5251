//go:build linux

package capture

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
)

// IPTablesMode is the iptables backend a node uses: the nf_tables-based iptables-nft or the
// legacy x_tables one. Capture must match the node's choice so that one tool sees all rules.
type IPTablesMode string

// The iptables modes.
const (
	IPTablesNFT    IPTablesMode = "nft"
	IPTablesLegacy IPTablesMode = "legacy"
)

// IPTables applies rule sets with iptables-restore and ip6tables-restore (the fallback for
// nodes whose networking is iptables based). Unlike NFTables it starts processes (nsenter into
// the pod netns, then the -restore tool): x_tables has no stable netlink API. Each table is
// committed atomically by iptables-restore; aether's chains (AETHER-*) are declared (and so
// flushed) and refilled in one COMMIT, and the jumps from the built-in chains are inserted only
// when missing.
type IPTables struct {
	Mode IPTablesMode
}

func (b IPTables) bin(fam Family, tool string) string {
	p := "iptables"
	if fam == FamilyIPv6 {
		p = "ip6tables"
	}
	return p + "-" + string(b.Mode) + tool
}

// run runs an iptables tool inside the netns at netnsPath (nsenter --net).
func (b IPTables) run(netnsPath string, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.Command("nsenter", append([]string{"--net=" + netnsPath, "--", name}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

var families = []Family{FamilyIPv4, FamilyIPv6}

// Apply makes the netns hold exactly rs in aether's chains for IPv4 and IPv6; it writes nothing
// when Check passes and reports whether it changed anything.
func (b IPTables) Apply(netnsPath string, rs RuleSet) (bool, error) {
	if b.Mode != IPTablesNFT && b.Mode != IPTablesLegacy {
		return false, fmt.Errorf("apply capture rules: iptables mode %q: want nft or legacy", b.Mode)
	}
	if err := b.Check(netnsPath, rs); err == nil {
		return false, nil
	} else if !isDriftErr(err) {
		return false, fmt.Errorf("apply capture rules: %w", err)
	}
	var stale []Hook
	for _, h := range allHooks {
		if !slices.ContainsFunc(rs.Chains, func(c Chain) bool { return c.Hook == h }) {
			stale = append(stale, h)
		}
	}
	if err := b.remove(netnsPath, stale); err != nil {
		return false, fmt.Errorf("apply capture rules: %w", err)
	}
	for _, fam := range families {
		if _, err := b.run(netnsPath, []byte(rs.IPTablesRestore(fam)), b.bin(fam, "-restore"), "--noflush", "-w"); err != nil {
			return false, fmt.Errorf("apply capture rules: %w", err)
		}
		for _, j := range rs.IPTablesJumps() {
			// The jump must be the built-in chain's first rule (see Check): one that is
			// missing, or behind a rule someone inserted before it, is deleted (every copy) and
			// inserted first. The foreign rule stays where it is, now behind ours.
			first, err := b.run(netnsPath, nil, b.bin(fam, ""), "-w", "-t", j.Table, "-S", j.Chain, "1")
			if err == nil && isJumpTo(string(first), j.target()) {
				continue
			}
			b.deleteJump(netnsPath, fam, j)
			args := append([]string{"-w", "-t", j.Table, "-I", j.Chain, "1"}, j.Rule...)
			if _, err := b.run(netnsPath, nil, b.bin(fam, ""), args...); err != nil {
				return false, fmt.Errorf("apply capture rules: %w", err)
			}
		}
	}
	return true, nil
}

var commentRE = regexp.MustCompile(`--comment "?(aether:[^" ]+)"?`)

// Check compares aether's chains (per family, via iptables-save) with rs by the rules' aether
// comments, in order (a rule without one in aether's chains is drift), and verifies each jump
// from a built-in chain, which must be that chain's first rule: a rule before it (an ACCEPT or
// RETURN someone inserted with -I) ends the built-in chain for the packets it matches before
// they reach aether's chain, so they would leave uncaptured, or enter past strict mode. It
// returns a *DriftError for a difference.
func (b IPTables) Check(netnsPath string, rs RuleSet) error {
	if _, err := os.Stat(netnsPath); err != nil {
		return fmt.Errorf("check capture rules: %w", err)
	}
	for _, fam := range families {
		out, err := b.run(netnsPath, nil, b.bin(fam, "-save"))
		if err != nil {
			return fmt.Errorf("check capture rules: %w", err)
		}
		// "table chain" -> comments: built-in chains such as OUTPUT exist in several tables
		// (nat and filter), each with its own jump.
		live := map[string][]string{}
		first := map[string]string{} // "table chain" -> the built-in chain's first rule
		wanted := map[string]bool{}
		for _, ch := range rs.Chains {
			wanted[ch.Hook.iptablesChain()] = true
		}
		table := ""
		for _, line := range strings.Split(string(out), "\n") {
			if t, ok := strings.CutPrefix(line, "*"); ok {
				table = t
				continue
			}
			if name, ok := strings.CutPrefix(line, ":"+ChainPrefix); ok {
				if chain := ChainPrefix + strings.Fields(name)[0]; !wanted[chain] {
					return &DriftError{What: fmt.Sprintf("%s: chain %s is not in the rule set", b.bin(fam, ""), chain)}
				}
			}
			if !strings.HasPrefix(line, "-A ") {
				continue
			}
			name := strings.Fields(line)[1]
			chain := table + " " + name
			if _, seen := first[chain]; !seen {
				first[chain] = line
			}
			if m := commentRE.FindStringSubmatch(line); m != nil {
				live[chain] = append(live[chain], m[1])
			} else if strings.HasPrefix(name, ChainPrefix) {
				// A rule without our tag in our chain was added by someone else: drift.
				live[chain] = append(live[chain], "untagged: "+line)
			}
		}
		for _, ch := range rs.Chains {
			table, builtin := ch.Hook.iptables()
			name := ch.Hook.iptablesChain()
			var want []string
			for _, r := range ch.Rules {
				if r.Family == FamilyAny || r.Family == fam {
					want = append(want, r.Comment())
				}
			}
			if got := live[table+" "+name]; !slices.Equal(got, want) {
				return &DriftError{What: fmt.Sprintf("%s chain %s holds %d aether rules, want %d", b.bin(fam, ""), name, len(got), len(want))}
			}
			if !slices.Contains(live[table+" "+builtin], Tag+":jump") {
				return &DriftError{What: fmt.Sprintf("%s: jump from %s %s to %s is missing", b.bin(fam, ""), table, builtin, name)}
			}
			if f := first[table+" "+builtin]; !isJumpTo(f, name) {
				return &DriftError{What: fmt.Sprintf("%s: jump from %s %s to %s is not the chain's first rule: %q comes before it and can take packets past capture",
					b.bin(fam, ""), table, builtin, name, f)}
			}
		}
	}
	return nil
}

// Teardown removes the jumps into aether's chains and the chains themselves, for both families.
// A missing netns, jump or chain is success.
func (b IPTables) Teardown(netnsPath string) error {
	if _, err := os.Stat(netnsPath); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := b.remove(netnsPath, allHooks); err != nil {
		return fmt.Errorf("remove capture rules: %w", err)
	}
	return nil
}

// allHooks are the hooks aether may have a chain on.
var allHooks = []Hook{HookOutputNAT, HookOutputFilter, HookInputFilter}

// remove deletes aether's chains for hooks, and every jump to them, in both families; what is
// missing is skipped.
func (b IPTables) remove(netnsPath string, hooks []Hook) error {
	var rs RuleSet
	for _, h := range hooks {
		rs.Chains = append(rs.Chains, Chain{Hook: h})
	}
	for _, fam := range families {
		for _, j := range rs.IPTablesJumps() {
			b.deleteJump(netnsPath, fam, j)
		}
		for _, ch := range rs.Chains {
			table, _ := ch.Hook.iptables()
			name := ch.Hook.iptablesChain()
			if _, err := b.run(netnsPath, nil, b.bin(fam, ""), "-w", "-t", table, "-F", name); err != nil {
				continue // no such chain
			}
			if _, err := b.run(netnsPath, nil, b.bin(fam, ""), "-w", "-t", table, "-X", name); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteJump deletes every copy of the jump j (up to 10); a missing one is skipped.
func (b IPTables) deleteJump(netnsPath string, fam Family, j IPTablesJump) {
	for i := 0; i < 10; i++ {
		args := append([]string{"-w", "-t", j.Table, "-D", j.Chain}, j.Rule...)
		if _, err := b.run(netnsPath, nil, b.bin(fam, ""), args...); err != nil {
			return
		}
	}
}

// target returns the aether chain the jump goes to (the argument of its -j).
func (j IPTablesJump) target() string { return j.Rule[len(j.Rule)-1] }

// isJumpTo reports whether rule (one "-A CHAIN ..." line of iptables-save or iptables -S) is
// aether's tagged jump to chain.
func isJumpTo(rule, chain string) bool {
	m := commentRE.FindStringSubmatch(rule)
	f := strings.Fields(rule)
	return m != nil && m[1] == Tag+":jump" && len(f) > 1 && f[len(f)-2] == "-j" && f[len(f)-1] == chain
}

func isDriftErr(err error) bool {
	var d *DriftError
	return errors.As(err, &d)
}

// DetectIPTablesMode tells which iptables backend the node uses, the way Kubernetes'
// iptables-wrappers do: whichever of iptables-legacy-save and iptables-nft-save shows more rules
// (in the current netns, or the one at netnsPath when non-empty). With no rules in either it
// returns IPTablesNFT, the default of current distributions.
func DetectIPTablesMode(netnsPath string) (IPTablesMode, error) {
	count := func(tool string) (int, error) {
		var cmd *exec.Cmd
		if netnsPath != "" {
			cmd = exec.Command("nsenter", "--net="+netnsPath, "--", tool)
		} else {
			cmd = exec.Command(tool)
		}
		out, err := cmd.Output()
		if err != nil {
			return 0, fmt.Errorf("detect iptables mode: %s: %w", tool, err)
		}
		n := 0
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "-A ") || (strings.HasPrefix(l, ":") && !builtinChainRE.MatchString(l)) {
				n++
			}
		}
		return n, nil
	}
	legacy, err := count("iptables-legacy-save")
	if err != nil {
		return "", err
	}
	nft, err := count("iptables-nft-save")
	if err != nil {
		return "", err
	}
	if legacy > nft {
		return IPTablesLegacy, nil
	}
	return IPTablesNFT, nil
}

var builtinChainRE = regexp.MustCompile(`^:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) `)

// NewBackend returns the backend named by an agent flag: "nftables" (or "") for NFTables,
// "iptables" for IPTables in the mode the node already uses (DetectIPTablesMode in the agent's
// own netns, which is the node's), "iptables-nft" / "iptables-legacy" to force a mode. Any other
// name is an error naming it.
func NewBackend(name string) (Backend, error) {
	switch name {
	case "", "nftables":
		return NFTables{}, nil
	case "iptables":
		m, err := DetectIPTablesMode("")
		if err != nil {
			return nil, fmt.Errorf("select capture backend: %w", err)
		}
		return IPTables{Mode: m}, nil
	case "iptables-nft":
		return IPTables{Mode: IPTablesNFT}, nil
	case "iptables-legacy":
		return IPTables{Mode: IPTablesLegacy}, nil
	}
	return nil, fmt.Errorf("select capture backend: %q: want nftables, iptables, iptables-nft or iptables-legacy", name)
}
