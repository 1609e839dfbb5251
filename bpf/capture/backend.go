package capture

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	nft "github.com/aethermesh/aether/capture"
)

// Backend is the eBPF form of capture.Backend: a pod's outbound TCP and DNS are captured by the
// programs of Capture (its PodSettings, FromConfig of the rule set's Config, keyed by its netns
// cookie), and NFT keeps only what the programs do not do (nftPart: the filter chains, the routed
// UDP frontends). A pod whose settings cannot be loaded (a full map, a netns cookie that cannot
// be read, a forced failure) gets the whole rule set from NFT instead, so it is never left with
// neither; that is logged and reported to OnFallback, and every later Apply tries eBPF again.
// Capture and NFT are required; the zero values of the rest are usable.
type Backend struct {
	Capture *Capture
	NFT     nft.Backend
	Log     *slog.Logger
	// OnFallback, when set, is called each time a pod's capture falls back to NFT, with the
	// pod's netns path and the cause.
	OnFallback func(netnsPath string, err error)
	// FailSetPod, when set, is called before each SetPod and its error taken as SetPod's: the
	// hook tests use to force a load failure.
	FailSetPod func(netnsPath string) error
	// Retire is for the programs an earlier eBPF agent pinned on a node now in nft mode: every
	// Apply gives the pod the whole nft rule set and then removes its map entries, and Prune
	// removes the pins under PinDir and closes Capture once the maps hold no pod.
	Retire bool
	PinDir string

	mu sync.Mutex
	// retired is set once Prune removed the pins of a Retire backend and closed Capture.
	retired bool
	// pods holds, by netns path, what the last Apply in this process installed.
	pods map[string]podState
}

// podState is what Backend installed for one netns.
type podState struct {
	cookie   uint64
	fallback bool      // the whole rule set is in nft, no map entries
	applied  time.Time // when Apply last set the pod's map entries
}

var (
	_ nft.Backend = (*Backend)(nil)
	_ nft.Pruner  = (*Backend)(nil)
)

func (b *Backend) log() *slog.Logger {
	if b.Log == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return b.Log
}

// nftPart returns the rules of rs that stay with nft when the programs capture the pod: rs
// without the output_nat chain's TCP redirect and DNS DNAT rules (out-redirect, out-dns-*), and
// without output_nat at all when no DNAT (a routed UDP frontend) is left in it (pure).
func nftPart(rs nft.RuleSet) nft.RuleSet {
	out := nft.RuleSet{Config: rs.Config}
	for _, ch := range rs.Chains {
		if ch.Hook != nft.HookOutputNAT {
			out.Chains = append(out.Chains, ch)
			continue
		}
		keep := ch
		keep.Rules = slices.DeleteFunc(slices.Clone(ch.Rules), func(r nft.Rule) bool {
			return r.ID == "out-redirect" || strings.HasPrefix(r.ID, "out-dns-")
		})
		if slices.ContainsFunc(keep.Rules, func(r nft.Rule) bool { return r.Verdict.Kind == nft.VerdictDNAT }) {
			out.Chains = append(out.Chains, keep)
		}
	}
	return out
}

// samePod reports whether two normalized settings are equal (nil and empty lists alike).
func samePod(a, b PodSettings) bool {
	return a.CapturePort == b.CapturePort && a.BypassMark == b.BypassMark && a.IPv6 == b.IPv6 &&
		slices.Equal(a.LocalAddrs, b.LocalAddrs) && slices.Equal(a.ExcludeCIDRs, b.ExcludeCIDRs) &&
		slices.Equal(a.ExcludePorts, b.ExcludePorts) && slices.Equal(a.PassThrough, b.PassThrough) &&
		slices.Equal(a.DenyCIDRs, b.DenyCIDRs) && slices.Equal(a.DNS, b.DNS)
}

// active returns Capture, or nil once a Retire backend has retired it.
func (b *Backend) active() *Capture {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.retired {
		return nil
	}
	return b.Capture
}

// pod returns the map entries of the pod with netnsCookie, and whether it has any (none once
// retired).
func (b *Backend) pod(netnsCookie uint64) (PodSettings, bool, error) {
	c := b.active()
	if c == nil {
		return PodSettings{}, false, nil
	}
	all, err := c.ListPods()
	if err != nil {
		return PodSettings{}, false, err
	}
	s, ok := all[netnsCookie]
	return s, ok, nil
}

// Apply makes the pod at netnsPath captured by the programs with rs.Config's settings and its
// netns hold exactly nftPart(rs); it reports whether it changed anything. When the settings
// cannot be loaded it applies the whole rs with NFT first and then removes the pod's map
// entries (the fallback); its error is then NFT's.
func (b *Backend) Apply(netnsPath string, rs nft.RuleSet) (bool, error) {
	if b.retiring() {
		cookie, _ := NetnsCookie(netnsPath)
		return b.fallback(netnsPath, cookie, rs, nil)
	}
	cookie, err := NetnsCookie(netnsPath)
	if err != nil {
		return b.fallback(netnsPath, 0, rs, err)
	}
	want, err := FromConfig(rs.Config)
	if err != nil {
		return b.fallback(netnsPath, cookie, rs, err)
	}
	cur, have, err := b.pod(cookie)
	if err != nil {
		return b.fallback(netnsPath, cookie, rs, err)
	}
	changed := false
	// Marked before SetPod, so a Prune that finds the new entries also finds the mark.
	b.setState(netnsPath, podState{cookie: cookie, applied: time.Now()})
	if !have || !samePod(cur, want) {
		if b.FailSetPod != nil {
			err = b.FailSetPod(netnsPath)
		}
		if err == nil {
			err = b.Capture.SetPod(cookie, want)
		}
		if err != nil {
			return b.fallback(netnsPath, cookie, rs, err)
		}
		changed = true
	}
	// The programs capture the pod from here on; only now may the nat rules go.
	nchanged, err := b.NFT.Apply(netnsPath, nftPart(rs))
	return changed || nchanged, err
}

// setState records what Apply installed for netnsPath.
func (b *Backend) setState(netnsPath string, st podState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pods == nil {
		b.pods = map[string]podState{}
	}
	b.pods[netnsPath] = st
}

// retiring reports whether Retire is set (the pods go to nft; Capture is nil once retired).
func (b *Backend) retiring() bool {
	return b.Retire
}

// fallback gives the pod at netnsPath the whole rule set rs in nft and then removes its map
// entries (cookie 0: none known), reporting cause (nil: a retirement, not a failure).
func (b *Backend) fallback(netnsPath string, cookie uint64, rs nft.RuleSet, cause error) (bool, error) {
	if cause != nil {
		b.log().Warn("eBPF capture of the pod failed: captured by nft instead", "netns", netnsPath, "err", cause)
		if b.OnFallback != nil {
			b.OnFallback(netnsPath, cause)
		}
	}
	changed, err := b.NFT.Apply(netnsPath, rs)
	if err != nil {
		return changed, err
	}
	if cookie != 0 {
		if _, have, lerr := b.pod(cookie); lerr == nil && have {
			if derr := b.Capture.DeletePod(cookie); derr != nil {
				b.log().Warn("remove the eBPF settings of a pod captured by nft", "netns", netnsPath, "err", derr)
			}
		}
	}
	b.setState(netnsPath, podState{cookie: cookie, fallback: true})
	return changed, nil
}

// Check returns nil when the pod at netnsPath is captured as Apply leaves it: by the programs
// with rs.Config's settings and nftPart(rs) in its netns, or, after a fallback in this process,
// by the whole rs in nft. A missing or different map entry is a *capture.DriftError.
func (b *Backend) Check(netnsPath string, rs nft.RuleSet) error {
	b.mu.Lock()
	st, known := b.pods[netnsPath]
	b.mu.Unlock()
	if b.retiring() || known && st.fallback {
		return b.NFT.Check(netnsPath, rs)
	}
	cookie, err := NetnsCookie(netnsPath)
	if err != nil {
		return fmt.Errorf("check eBPF capture: %w", err)
	}
	want, err := FromConfig(rs.Config)
	if err != nil {
		return fmt.Errorf("check eBPF capture: %w", err)
	}
	cur, have, err := b.pod(cookie)
	switch {
	case err != nil:
		return fmt.Errorf("check eBPF capture: %w", err)
	case !have:
		return &nft.DriftError{What: fmt.Sprintf("eBPF settings of netns cookie %d missing", cookie)}
	case !samePod(cur, want):
		return &nft.DriftError{What: fmt.Sprintf("eBPF settings of netns cookie %d differ: have %+v, want %+v", cookie, cur, want)}
	}
	return b.NFT.Check(netnsPath, nftPart(rs))
}

// Teardown removes the pod's map entries (by the cookie Apply recorded, else the netns's own)
// and every aether rule from its netns. A netns that is gone and unknown to this process leaves
// its entries to Prune.
func (b *Backend) Teardown(netnsPath string) error {
	b.mu.Lock()
	st, known := b.pods[netnsPath]
	b.mu.Unlock()
	cookie := st.cookie
	if !known || cookie == 0 {
		c, err := NetnsCookie(netnsPath)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove eBPF capture: %w", err)
		}
		cookie = c
	}
	if cookie != 0 {
		if _, have, err := b.pod(cookie); err != nil {
			return fmt.Errorf("remove eBPF capture: %w", err)
		} else if have {
			if err := b.Capture.DeletePod(cookie); err != nil {
				return fmt.Errorf("remove eBPF capture: %w", err)
			}
		}
	}
	if err := b.NFT.Teardown(netnsPath); err != nil {
		return err
	}
	b.mu.Lock()
	delete(b.pods, netnsPath)
	b.mu.Unlock()
	return nil
}

// Prune removes the map entries of every pod whose netns is not one of keep (the netns paths of
// the live captured attachments, listed after since) and that no Apply of this process set after
// since (an ADD racing the caller's listing), logging each cookie. It returns how many it removed. It
// removes nothing when the cookie of a netns in keep cannot be read for another reason than its
// absence: that pod's entries cannot be told apart from stale ones.
func (b *Backend) Prune(since time.Time, keep []string) (int, error) {
	if b.active() == nil {
		return 0, nil
	}
	live := map[uint64]bool{}
	for _, p := range keep {
		c, err := NetnsCookie(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("prune eBPF capture: %w", err)
		}
		live[c] = true
	}
	all, err := b.Capture.ListPods()
	if err != nil {
		return 0, fmt.Errorf("prune eBPF capture: %w", err)
	}
	// Read after ListPods: Apply marks a pod before it writes its entries, so every entry listed
	// that an Apply since wrote has its mark here.
	b.mu.Lock()
	for _, st := range b.pods {
		if st.applied.After(since) {
			live[st.cookie] = true
		}
	}
	b.mu.Unlock()
	var gone []uint64
	var errs []error
	for c := range all {
		if live[c] {
			continue
		}
		if err := b.Capture.DeletePod(c); err != nil {
			errs = append(errs, err)
			continue
		}
		gone = append(gone, c)
	}
	slices.Sort(gone)
	if len(gone) > 0 {
		b.log().Info("eBPF settings of pods gone removed", "netnsCookies", fmt.Sprint(gone))
	}
	if len(errs) > 0 {
		return len(gone), fmt.Errorf("prune eBPF capture: %w", errors.Join(errs...))
	}
	if b.Retire && len(gone) == len(all) {
		if err := RemovePins(b.PinDir); err != nil {
			return len(gone), fmt.Errorf("prune eBPF capture: %w", err)
		}
		b.mu.Lock()
		b.retired = true
		b.mu.Unlock()
		_ = b.Capture.Close()
		b.log().Info("eBPF capture retired: no pod left in the maps, pins removed and programs detached", "dir", b.PinDir)
	}
	return len(gone), nil
}
