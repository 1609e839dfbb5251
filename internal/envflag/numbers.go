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
	if v := s.Getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			s.errs = append(s.errs, fmt.Errorf("env %s %q: want a duration such as 30s or 24h", env, v))
		} else {
			def = d
		}
	}
	s.FS.DurationVar(p, name, def, usage(text, env))
}

// IntVar defines an integer flag stored in p, default env's value (a decimal integer) or def when
// env is unset. A value that does not parse is reported by Err, naming the variable and the
// value.
func (s *Set) IntVar(p *int, name, env string, def int, text string) {
	if v := s.Getenv(env); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			s.errs = append(s.errs, fmt.Errorf("env %s %q: want an integer", env, v))
		} else {
			def = n
		}
	}
	s.FS.IntVar(p, name, def, usage(text, env))
}
