// Package opt is the one error type of every package's Options.Validate:
// the field that cannot work and why, so that main can name the flag and
// environment variable a field is set by.
package opt

import "errors"

// Error is a setting that cannot work.
type Error struct {
	Field string // the Options field, "Shard.RecordTTL" once app has prefixed it
	Why   string
}

func (e *Error) Error() string { return e.Field + " " + e.Why }

// Bad is the error of a field.
func Bad(field, why string) error { return &Error{Field: field, Why: why} }

// In prefixes the field of err (an *Error) with the name of the Options it
// sits in; other errors pass unchanged.
func In(prefix string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return &Error{Field: prefix + "." + e.Field, Why: e.Why}
	}
	return err
}

// Fill sets *v to d when *v is its zero value: a zero setting takes its
// default.
func Fill[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}
