package envflag

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

// TestSet: a flag on the command line wins over its variable, a set variable over the default,
// an empty variable counts as unset; usage names the variable once; a boolean variable that does
// not parse is an error naming it and its value.
func TestSet(t *testing.T) {
	env := map[string]string{"A": "from-env", "EMPTY": "", "ON": "true", "BAD": "yes please"}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := &Set{FS: fs, Getenv: func(k string) string { return env[k] }}
	a := s.String("a", "A", "def-a", "flag a")
	var b, c string
	s.StringVar(&b, "b", "A", "def-b", "flag b (env A)")
	s.StringVar(&c, "c", "EMPTY", "def-c", "flag c")
	var on, off, bad bool
	s.BoolVar(&on, "on", "ON", "flag on")
	s.BoolVar(&off, "off", "UNSET", "flag off")
	s.BoolVar(&bad, "bad", "BAD", "flag bad")
	if err := fs.Parse([]string{"-b", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if *a != "from-env" || b != "from-flag" || c != "def-c" || !on || off || bad {
		t.Errorf("a=%q b=%q c=%q on=%v off=%v bad=%v; want from-env from-flag def-c true false false", *a, b, c, on, off, bad)
	}
	if u := fs.Lookup("a").Usage; u != "flag a (env A)" {
		t.Errorf("usage of a = %q, want %q", u, "flag a (env A)")
	}
	if u := fs.Lookup("b").Usage; strings.Count(u, "env A") != 1 {
		t.Errorf("usage of b = %q, want the variable named once", u)
	}
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), `env BAD "yes please"`) {
		t.Errorf("Err() = %v, want an error naming BAD and its value", err)
	}
}

// TestParseAndList: Parse returns flag.ErrHelp for --help, the environment errors, and an error
// naming stray arguments; List trims and drops empty items.
func TestParseAndList(t *testing.T) {
	newSet := func(env map[string]string) *Set {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		s := &Set{FS: fs, Getenv: func(k string) string { return env[k] }}
		var b bool
		s.BoolVar(&b, "b", "B", "flag b")
		return s
	}
	if err := newSet(nil).Parse([]string{"--help"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("Parse(--help) = %v, want flag.ErrHelp", err)
	}
	if err := newSet(map[string]string{"B": "maybe"}).Parse(nil); err == nil || !strings.Contains(err.Error(), `env B "maybe"`) {
		t.Errorf("Parse with B=maybe: %v, want an error naming B", err)
	}
	if err := newSet(nil).Parse([]string{"-b", "extra"}); err == nil || !strings.Contains(err.Error(), `unexpected arguments ["extra"]`) {
		t.Errorf("Parse with a stray argument: %v, want an error naming it", err)
	}
	if err := newSet(nil).Parse([]string{"-b"}); err != nil {
		t.Errorf("Parse(-b) = %v", err)
	}
	if got := List(" a, ,b ,"); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("List = %q, want [a b]", got)
	}
	if got := List(""); got != nil {
		t.Errorf("List(\"\") = %q, want nil", got)
	}
}
