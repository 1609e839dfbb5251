// Package envflag defines command-line flags whose defaults come from environment variables, the
// way the DaemonSet and Deployment configure aether's binaries (a ConfigMap's keys as env, flags
// for overrides): a flag given on the command line wins, else a non-empty variable, else the
// built-in default. Each flag's usage names its variable. It owns no flag's meaning; the
// binaries' config parsers do.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Set defines flags on FS with defaults read through Getenv (os.Getenv in the binaries, a map in
// tests).
type Set struct {
	FS     *flag.FlagSet
	Getenv func(string) string
	errs   []error
}

// usage appends " (env NAME)" unless the text already names the variable.
func usage(text, env string) string {
	if strings.Contains(text, "env "+env) {
		return text
	}
	return text + " (env " + env + ")"
}

// Value returns the variable env when it is set and not empty, else def.
func (s *Set) Value(env, def string) string {
	if v := s.Getenv(env); v != "" {
		return v
	}
	return def
}

// StringVar defines a string flag stored in p, default env's value or def.
func (s *Set) StringVar(p *string, name, env, def, text string) {
	s.FS.StringVar(p, name, s.Value(env, def), usage(text, env))
}

// String defines a string flag, default env's value or def, and returns its value's address.
func (s *Set) String(name, env, def, text string) *string {
	p := new(string)
	s.StringVar(p, name, env, def, text)
	return p
}

// BoolVar defines a boolean flag stored in p, default env's value (strconv.ParseBool: true,
// false, 1, 0, ...) or false when env is unset. A value that does not parse is reported by Err,
// naming the variable and the value.
func (s *Set) BoolVar(p *bool, name, env, text string) { s.BoolVarDefault(p, name, env, false, text) }

// BoolVarDefault is BoolVar with def when env is unset: a setting that is on by default, turned
// off with --name=false.
func (s *Set) BoolVarDefault(p *bool, name, env string, def bool, text string) {
	s.FS.BoolVar(p, name, envDefault(s, env, def, strconv.ParseBool, "true or false"), usage(text, env))
}

// Err returns the errors of environment values that could not be read as their flag's type, or
// nil.
func (s *Set) Err() error { return errors.Join(s.errs...) }

// Parse parses args (without the program name) on FS and returns flag.ErrHelp for -h/--help, a
// flag's parse error, the environment errors of Err, or an error naming stray arguments.
func (s *Set) Parse(args []string) error {
	if err := s.FS.Parse(args); err != nil {
		return err
	}
	if err := s.Err(); err != nil {
		return err
	}
	if s.FS.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", s.FS.Args())
	}
	return nil
}

// List splits a comma-separated flag value into its trimmed, non-empty items (nil for none).
func List(v string) []string {
	var out []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// File is a flag whose value names a file: the flag's name (without dashes) and its value.
type File struct{ Flag, Path string }

// CheckFiles returns, for each file with a non-empty Path that cannot be stat'ed, an error naming
// the flag and the path ("--registry-ca \"/x\": ..."), in the order given; nil when all exist.
func CheckFiles(files ...File) []error {
	var errs []error
	for _, f := range files {
		if f.Path == "" {
			continue
		}
		if _, err := os.Stat(f.Path); err != nil {
			errs = append(errs, fmt.Errorf("--%s %q: %w", f.Flag, f.Path, err))
		}
	}
	return errs
}
