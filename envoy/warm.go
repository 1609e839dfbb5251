package envoy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aethermesh/aether/model"
)

// WaitListenersWarm polls Envoy's admin API at adminAddress (host:port or unix://path) every
// 5 ms until none of the named dynamic listeners is warming and Envoy is LIVE (/ready), and
// returns nil then. Names Envoy
// does not hold are ignored: call it after Envoy ACKed the listeners (Server.WaitForAck).
//
// Envoy ACKs an LDS response once it has added the listeners, but a listener whose filter chains
// need routes (RDS) or secrets (SDS) stays warming, not accepting connections, until they arrive
// (Envoy architecture overview, "Listener discovery service: listener warming"). The state comes
// from /config_dump?resource=dynamic_listeners filtered by name (admin.v3.ListenersConfigDump,
// DynamicListener.warming_state and error_state; name_regex as nameFilter builds it, then the
// exact names here). A listener in error_state (its last update
// failed, for example its socket could not be bound) is an error naming it and Envoy's detail;
// so is ctx ending, naming the listeners still warming.
func WaitListenersWarm(ctx context.Context, adminAddress string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	q := url.Values{"resource": {"dynamic_listeners"}}
	if re := nameFilter(names); re != "" {
		q.Set("name_regex", re)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	c, base := AdminClient(adminAddress)
	path := base + "/config_dump?" + q.Encode()
	var last error
	for {
		warming, err := warmingListeners(ctx, c, path, want)
		if err == nil && len(warming) == 0 {
			// Listeners Envoy took before its workers started (while it initialises, waiting
			// for its first configuration) are active in the config dump but accept no
			// connection until the server is LIVE.
			err = live(ctx, c, base)
		}
		if err == nil && len(warming) == 0 {
			return nil
		}
		if _, failed := errors.AsType[*listenerError](err); failed {
			return err
		}
		switch {
		case err == nil:
			last = fmt.Errorf("still warming: %s", strings.Join(warming, ", "))
		case ctx.Err() == nil || last == nil:
			// (A poll cut short by ctx keeps the last state seen.)
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for listeners %s to leave warming: %w (last: %v)", strings.Join(names, ", "), context.Cause(ctx), last)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// live returns nil when Envoy's /ready answers LIVE (its workers run), else an error with the
// state it answered.
func live(ctx context.Context, c *http.Client, base string) error {
	_, b, err := adminGet(ctx, c, base+"/ready")
	if err != nil {
		return err
	}
	if st := strings.TrimSpace(string(b)); st != "LIVE" {
		return fmt.Errorf("envoy not live yet: %s", st)
	}
	return nil
}

// listenerError is a listener in Envoy's error_state.
type listenerError struct{ name, detail string }

func (e *listenerError) Error() string {
	return fmt.Sprintf("envoy failed listener %s: %s", e.name, e.detail)
}

// maxAdminRegex is the largest RE2 program Envoy compiles by default
// (re2.max_program_size.error_level, 100 instructions); the admin API's name_regex is held to it
// too ("RE2 program size of 115 > max program size of 100").
const maxAdminRegex = 100

// nameFilter returns a config dump name_regex that matches every one of names: their exact
// alternation "^(a|b|c)$" when its RE2 program fits maxAdminRegex, else the longest suffix the
// names share that fits ("<suffix>$"; listener names of one pod share "|<namespace>/<pod>"),
// else "" (no filter). Names are long on real clusters (a Deployment's pod name and its
// namespace, up to 63 characters each), so the filter may match other listeners too: the caller
// keeps the exact names.
func nameFilter(names []string) string {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	if re := "^(" + strings.Join(quoted, "|") + ")$"; fits(re) {
		return re
	}
	suffix := names[0]
	for _, n := range names[1:] {
		i := 0
		for i < len(suffix) && i < len(n) && suffix[len(suffix)-1-i] == n[len(n)-1-i] {
			i++
		}
		suffix = suffix[len(suffix)-i:]
	}
	for ; suffix != ""; suffix = suffix[1:] {
		if re := regexp.QuoteMeta(suffix) + "$"; utf8.ValidString(suffix) && fits(re) {
			return re
		}
	}
	return ""
}

func fits(re string) bool {
	n, err := model.RE2ProgramSize(re)
	return err == nil && n <= maxAdminRegex
}

// warmingListeners GETs path (a dynamic_listeners config dump) and returns the names of the
// listeners in it and in want that are warming, or a *listenerError for one in error_state.
func warmingListeners(ctx context.Context, c *http.Client, path string, want map[string]bool) ([]string, error) {
	status, b, err := adminGet(ctx, c, path)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("envoy admin config_dump: status %d: %s", status, b)
	}
	var dump struct {
		Configs []struct {
			Name         string          `json:"name"`
			WarmingState json.RawMessage `json:"warming_state"`
			ErrorState   *struct {
				Details string `json:"details"`
			} `json:"error_state"`
		} `json:"configs"`
	}
	if err := json.Unmarshal(b, &dump); err != nil {
		return nil, fmt.Errorf("decode envoy config_dump of listeners: %w", err)
	}
	var warming []string
	for _, l := range dump.Configs {
		if !want[l.Name] {
			continue
		}
		if l.ErrorState != nil {
			return nil, &listenerError{name: l.Name, detail: l.ErrorState.Details}
		}
		if len(l.WarmingState) > 0 && string(l.WarmingState) != "null" {
			warming = append(warming, l.Name)
		}
	}
	return warming, nil
}
