package envflag

import (
	"fmt"
	"strconv"
	"time"
)

// DurationVar defines a duration flag stored in p, default env's value (time.ParseDuration:
// "30s", "24h") or def when env is unset. A value that does not parse is reported by Err, naming
// the variable and the value.
func (s *Set) DurationVar(p *time.Duration, name, env string, def time.Duration, text string) {
	s.FS.DurationVar(p, name, envDefault(s, env, def, time.ParseDuration, "a duration such as 30s or 24h"), usage(text, env))
}

// IntVar defines an integer flag stored in p, default env's value (a decimal integer) or def when
// env is unset. A value that does not parse is reported by Err, naming the variable and the
// value.
func (s *Set) IntVar(p *int, name, env string, def int, text string) {
	s.FS.IntVar(p, name, envDefault(s, env, def, strconv.Atoi, "an integer"), usage(text, env))
}

// envDefault returns env's value read by parse, or def when env is unset or its value does not
// parse; the latter is recorded for Err as "env NAME "value": want <want>".
func envDefault[T any](s *Set, env string, def T, parse func(string) (T, error), want string) T {
	v := s.Getenv(env)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		s.errs = append(s.errs, fmt.Errorf("env %s %q: want %s", env, v, want))
		return def
	}
	return x
}

// Uint64Var defines an unsigned integer flag stored in p, default env's value (a decimal
// integer) or def when env is unset. A value that does not parse is reported by Err, naming the
// variable and the value.
func (s *Set) Uint64Var(p *uint64, name, env string, def uint64, text string) {
	parse := func(v string) (uint64, error) { return strconv.ParseUint(v, 10, 64) }
	s.FS.Uint64Var(p, name, envDefault(s, env, def, parse, "a non-negative integer"), usage(text, env))
}
