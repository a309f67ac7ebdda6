package vpcsim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// AdminHandler serves the fault controls and a view of the model as
// HTTP/JSON, for `vpcsim fault` and `vpcsim status`:
//
//	POST /faults/latency     {"op":"AttachNetworkInterface","fixed":"50ms","jitter":"10ms"}
//	POST /faults/error-rate  {"op":"AssignPrivateIpAddresses","rate":0.2,"code":"InsufficientFreeAddressesInSubnet"}
//	POST /faults/fail-next   {"op":"AttachNetworkInterface","code":"AttachmentLimitExceeded"}
//	POST /faults/throttle    {"mutating":true,"perSecond":5,"burst":10}
//	POST /faults/imds-lag    {"lag":"2s"}
//	POST /faults/describe-lag {"lag":"2s"}
//	POST /faults/imds-override {"instanceId":"i-...","path":"meta-data/...","value":"..."} (or "hide":true, or "clear":true)
//	POST /faults/request-limits {"aws":true,"limits":{"AssignPrivateIpAddresses":{"capacity":100,"refillPerSecond":5}}} (or "off":true)
//	POST /faults/reset
//	GET  /calls              {"DescribeNetworkInterfaces":3,"imds":7}
//	GET  /request-limits     {"AssignPrivateIpAddresses":{"capacity":100,"refillPerSecond":5},...}
//	GET  /requests           {"byAction":{"CreateTags":{"accepted":9,"throttled":1}},"byCaller":{"100.64.0.10":{...}}}
//	GET  /metrics            the request counters and bucket limits in Prometheus' text format
//	GET  /state              {"vpcId":..., "subnets":[...], "securityGroups":[...], "instances":[...], "networkInterfaces":[...]}
//
// Durations are Go duration strings. A malformed request gets 400 with the reason.
func (c *Cloud) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	f := c.faults
	mux.HandleFunc("POST /faults/latency", adminPost(func(in struct {
		Op            string
		Fixed, Jitter duration
	}) error {
		f.SetLatency(orAny(in.Op), time.Duration(in.Fixed), time.Duration(in.Jitter))
		return nil
	}))
	mux.HandleFunc("POST /faults/error-rate", adminPost(func(in struct {
		Op, Code string
		Rate     float64
	}) error {
		if in.Rate < 0 || in.Rate > 1 {
			return fmt.Errorf("rate %v: want 0..1", in.Rate)
		}
		f.SetErrorRate(orAny(in.Op), in.Rate, in.Code)
		return nil
	}))
	mux.HandleFunc("POST /faults/fail-next", adminPost(func(in struct{ Op, Code string }) error {
		if in.Code == "" {
			return fmt.Errorf("code is required")
		}
		f.FailNext(orAny(in.Op), in.Code)
		return nil
	}))
	mux.HandleFunc("POST /faults/throttle", adminPost(func(in struct {
		Mutating  bool
		PerSecond float64
		Burst     int
	}) error {
		if in.PerSecond < 0 || in.Burst < 0 {
			return fmt.Errorf("perSecond and burst must not be negative")
		}
		f.SetThrottle(in.Mutating, in.PerSecond, in.Burst)
		return nil
	}))
	mux.HandleFunc("POST /faults/imds-lag", adminPost(func(in struct{ Lag duration }) error {
		f.SetIMDSLag(time.Duration(in.Lag))
		return nil
	}))
	mux.HandleFunc("POST /faults/describe-lag", adminPost(func(in struct{ Lag duration }) error {
		f.SetDescribeLag(time.Duration(in.Lag))
		return nil
	}))
	mux.HandleFunc("POST /faults/imds-override", adminPost(func(in struct {
		InstanceID, Path, Value string
		Hide, Clear             bool
	}) error {
		switch {
		case in.InstanceID == "":
			return fmt.Errorf("instanceId is required")
		case in.Clear:
			f.ClearIMDSOverrides(in.InstanceID)
		case in.Path == "":
			return fmt.Errorf("path is required")
		case in.Hide:
			f.HideIMDS(in.InstanceID, in.Path)
		default:
			f.SetIMDSOverride(in.InstanceID, in.Path, in.Value)
		}
		return nil
	}))
	// request-limits: "aws" starts from AWSRequestLimits, "off" removes
	// every bucket; "limits" sets buckets over AWS's (with "aws") or over
	// the current set.
	mux.HandleFunc("POST /faults/request-limits", adminPost(func(in struct {
		AWS, Off bool
		Limits   RequestLimits
	}) error {
		if in.Off && (in.AWS || len(in.Limits) > 0) {
			return fmt.Errorf("off takes no aws or limits")
		}
		if err := in.Limits.Validate(); err != nil {
			return err
		}
		l := f.RequestLimits()
		switch {
		case in.AWS:
			l = AWSRequestLimits()
		case in.Off:
			l = nil
		}
		for k, v := range in.Limits {
			l[k] = v
		}
		f.SetRequestLimits(l)
		return nil
	}))
	mux.HandleFunc("GET /request-limits", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, f.RequestLimits())
	})
	mux.HandleFunc("GET /requests", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"byAction": f.RequestCounts(), "byCaller": f.RequestCountsByCaller()})
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		f.writeMetrics(&b)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		io.WriteString(w, b.String())
	})
	mux.HandleFunc("POST /faults/reset", func(w http.ResponseWriter, r *http.Request) {
		f.Reset()
		writeJSON(w, map[string]bool{"ok": true})
	})
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, f.CallCounts())
	})
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{
			"vpcId": c.VPCID(), "vpcCidrs": c.VPCCIDRs(), "subnets": c.Subnets(), "securityGroups": c.SecurityGroups(),
			"instances": c.Instances(), "networkInterfaces": c.NetworkInterfaces(),
		})
	})
	return mux
}

func orAny(op string) string {
	if op == "" {
		return AnyOp
	}
	return op
}

// duration is a time.Duration read from a JSON string such as "250ms".
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"250ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("duration %q: want a non-negative Go duration such as \"250ms\"", s)
	}
	*d = duration(v)
	return nil
}

// adminPost decodes a JSON body into T (unknown fields refused) and applies it.
func adminPost[T any](apply func(T) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var in T
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := apply(in); err != nil {
			http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, map[string]bool{"ok": true})
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
