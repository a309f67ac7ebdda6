package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"
)

const faultUsage = `usage: vpcsim fault [flags] <fault> [args]

  latency    <op|*> <fixed> [jitter]      e.g. latency AttachNetworkInterface 200ms 50ms
  error-rate <op|*> <rate 0..1> <code>     e.g. error-rate AssignPrivateIpAddresses 0.2 InsufficientFreeAddressesInSubnet
  fail-next  <op|*> <code>                 e.g. fail-next AttachNetworkInterface AttachmentLimitExceeded
  throttle   <mutating|describe> <per-second> <burst>   (0 0 turns it off)
  imds-lag   <duration>
  reset
  calls                                    EC2 API calls by action ("imds" for IMDS reads)
`

// faultSpec is one fault subcommand: its argument counts and how its
// arguments become the admin API's JSON body.
type faultSpec struct {
	min, max int
	body     func(a []string) (any, error)
}

var faults = map[string]faultSpec{
	"latency": {2, 3, func(a []string) (any, error) {
		fixed, err := parseDuration(a[1])
		jitter := time.Duration(0)
		if err == nil && len(a) == 3 {
			jitter, err = parseDuration(a[2])
		}
		return map[string]any{"op": op(a[0]), "fixed": fixed.String(), "jitter": jitter.String()}, err
	}},
	"error-rate": {3, 3, func(a []string) (any, error) {
		rate, err := strconv.ParseFloat(a[1], 64)
		if err != nil || rate < 0 || rate > 1 {
			return nil, fmt.Errorf("rate %q: want a number from 0 to 1", a[1])
		}
		return map[string]any{"op": op(a[0]), "rate": rate, "code": a[2]}, nil
	}},
	"fail-next": {2, 2, func(a []string) (any, error) {
		return map[string]any{"op": op(a[0]), "code": a[1]}, nil
	}},
	"throttle": {3, 3, func(a []string) (any, error) {
		if a[0] != "mutating" && a[0] != "describe" {
			return nil, fmt.Errorf("%q: want mutating or describe", a[0])
		}
		rate, err1 := strconv.ParseFloat(a[1], 64)
		burst, err2 := strconv.Atoi(a[2])
		if err1 != nil || err2 != nil || rate < 0 || burst < 0 {
			return nil, fmt.Errorf("%s %s: want a non-negative rate per second and burst", a[1], a[2])
		}
		return map[string]any{"mutating": a[0] == "mutating", "perSecond": rate, "burst": burst}, nil
	}},
	"imds-lag": {1, 1, func(a []string) (any, error) {
		d, err := parseDuration(a[0])
		return map[string]any{"lag": d.String()}, err
	}},
	"reset": {0, 0, nil},
	"calls": {0, 0, nil},
}

func runFault(args []string) error {
	var c commonFlags
	fs := newFlagSet("fault", &c)
	fs.Usage = func() { fmt.Fprint(fs.Output(), faultUsage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("want a fault")
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	spec, ok := faults[name]
	if !ok || len(rest) < spec.min || len(rest) > spec.max {
		fs.Usage()
		return fmt.Errorf("fault %q with %d arguments", name, len(rest))
	}
	s, err := loadRunning(c)
	if err != nil {
		return err
	}
	if name == "calls" {
		var calls map[string]int
		if err := adminDo(s, http.MethodGet, "/calls", nil, &calls); err != nil {
			return err
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(calls)
	}
	var body []byte
	if spec.body != nil {
		v, err := spec.body(rest)
		if err != nil {
			return err
		}
		if body, err = json.Marshal(v); err != nil {
			return err
		}
	}
	return adminDo(s, http.MethodPost, "/faults/"+name, bytes.NewReader(body), nil)
}

// op maps "*" to "" (the admin API's every operation).
func op(s string) string {
	if s == "*" {
		return ""
	}
	return s
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("duration %q: want e.g. 250ms or 2s", s)
	}
	return d, nil
}
