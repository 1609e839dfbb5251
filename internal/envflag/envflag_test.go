package envflag

import (
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
