package main

import (
	"errors"
	"flag"
	"math"
	"strconv"
	"time"
)

// durationValue is a flag's duration: Go's form (1m30s, 500ms) or, as
// flock(1) and timeout(1) take it, a number of seconds (30, 2.5).
type durationValue time.Duration

// durationVar defines the duration flag name on fs, stored in p.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*durationValue)(p), name, usage)
}

var errDuration = errors.New("want a duration such as 1m30s or 500ms, or seconds such as 30 or 2.5")

func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || math.IsNaN(f) || math.Abs(f) > float64(math.MaxInt64/int64(time.Second)) {
			return errDuration
		}
		v = time.Duration(f * float64(time.Second))
	}
	*d = durationValue(v)
	return nil
}

func (d *durationValue) String() string { return time.Duration(*d).String() }

func (d *durationValue) Get() any { return time.Duration(*d) }
