package envflag

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// TestNumbers: duration and integer flags take their variable's value over the default and the
// command line's over both; a value that does not parse is an error naming the variable and the
// value, and the default stays.
func TestNumbers(t *testing.T) {
	env := map[string]string{"D": "24h", "N": "3", "BADD": "a day", "BADN": "three"}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := &Set{FS: fs, Getenv: func(k string) string { return env[k] }}
	var d, dflag, dunset, dbad time.Duration
	var n, nflag, nunset, nbad int
	s.DurationVar(&d, "d", "D", time.Second, "flag d")
	s.DurationVar(&dflag, "dflag", "D", time.Second, "flag dflag")
	s.DurationVar(&dunset, "dunset", "UNSET", time.Second, "flag dunset")
	s.DurationVar(&dbad, "dbad", "BADD", time.Second, "flag dbad")
	s.IntVar(&n, "n", "N", 1, "flag n")
	s.IntVar(&nflag, "nflag", "N", 1, "flag nflag")
	s.IntVar(&nunset, "nunset", "UNSET", 1, "flag nunset")
	s.IntVar(&nbad, "nbad", "BADN", 1, "flag nbad")
	if err := fs.Parse([]string{"--dflag", "5m", "--nflag", "7"}); err != nil {
		t.Fatal(err)
	}
	if d != 24*time.Hour || dflag != 5*time.Minute || dunset != time.Second || dbad != time.Second {
		t.Errorf("durations %s %s %s %s; want 24h0m0s 5m0s 1s 1s", d, dflag, dunset, dbad)
	}
	if n != 3 || nflag != 7 || nunset != 1 || nbad != 1 {
		t.Errorf("integers %d %d %d %d; want 3 7 1 1", n, nflag, nunset, nbad)
	}
	if u := fs.Lookup("d").Usage; u != "flag d (env D)" {
		t.Errorf("usage of d = %q", u)
	}
	err := s.Err()
	for _, want := range []string{`env BADD "a day"`, `env BADN "three"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Err() = %v, want it to name %s", err, want)
		}
	}
}
