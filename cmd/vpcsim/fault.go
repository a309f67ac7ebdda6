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
  request-limits aws|off                   the account's per-action request buckets: EC2's documented defaults, or none
  request-limits <action> <capacity> <refill-per-second>   one bucket, e.g. request-limits AssignPrivateIpAddresses 100 5
  imds-lag   <duration>
  reset
  calls                                    EC2 API calls by action ("imds" for IMDS reads)
  requests                                 requests the account's buckets accepted and throttled, by action and by caller
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
	"request-limits": {1, 3, func(a []string) (any, error) {
		switch {
		case len(a) == 1 && a[0] == "aws":
			return map[string]any{"aws": true}, nil
		case len(a) == 1 && a[0] == "off":
			return map[string]any{"off": true}, nil
		case len(a) == 3:
			capacity, err1 := strconv.ParseFloat(a[1], 64)
			refill, err2 := strconv.ParseFloat(a[2], 64)
			if err1 != nil || err2 != nil || capacity < 1 || refill <= 0 {
				return nil, fmt.Errorf("%s %s: want a capacity of at least 1 and a positive refill rate per second", a[1], a[2])
			}
			return map[string]any{"limits": map[string]any{a[0]: map[string]float64{"capacity": capacity, "refillPerSecond": refill}}}, nil
		}
		return nil, fmt.Errorf("%q: want aws, off, or <action> <capacity> <refill-per-second>", a)
	}},
	"imds-lag": {1, 1, func(a []string) (any, error) {
		d, err := parseDuration(a[0])
		return map[string]any{"lag": d.String()}, err
	}},
	"reset":    {0, 0, nil},
	"calls":    {0, 0, nil},
	"requests": {0, 0, nil},
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
	if name == "calls" || name == "requests" {
		var calls any
		if err := adminDo(s, http.MethodGet, "/"+name, nil, &calls); err != nil {
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
