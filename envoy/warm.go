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
// DynamicListener.warming_state and error_state). A listener in error_state (its last update
// failed, for example its socket could not be bound) is an error naming it and Envoy's detail;
// so is ctx ending, naming the listeners still warming.
func WaitListenersWarm(ctx context.Context, adminAddress string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	q := url.Values{"resource": {"dynamic_listeners"}, "name_regex": {"^(" + strings.Join(quoted, "|") + ")$"}}
	c, base := AdminClient(adminAddress)
	path := base + "/config_dump?" + q.Encode()
	var last error
	for {
		warming, err := warmingListeners(ctx, c, path)
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

// warmingListeners GETs path (a filtered dynamic_listeners config dump) and returns the names of
// the listeners in it that are warming, or a *listenerError for one in error_state.
func warmingListeners(ctx context.Context, c *http.Client, path string) ([]string, error) {
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
		if l.ErrorState != nil {
			return nil, &listenerError{name: l.Name, detail: l.ErrorState.Details}
		}
		if len(l.WarmingState) > 0 && string(l.WarmingState) != "null" {
			warming = append(warming, l.Name)
		}
	}
	return warming, nil
}
