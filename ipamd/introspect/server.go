package introspect

import (
	"encoding/json"
	"net/http"
	"net/netip"
)

// Handler serves the introspection endpoints (see the package comment),
// calling state once per request. Other methods than GET and HEAD answer 405,
// unknown paths 404. Slices in the bodies are never null, so clients can
// range over them without nil checks.
func Handler(state func() State) http.Handler {
	mux := http.NewServeMux()
	serve := func(path string, body func(State) any) {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, body(normalize(state())))
		})
	}
	serve("/v1/state", func(s State) any { return s })
	serve("/v1/pool", func(s State) any { return s.Pool })
	serve("/v1/enis", func(s State) any { return s.ENIs })
	serve("/v1/pods", func(s State) any { return Pods{Assignments: s.Assignments, Cooling: s.Cooling} })
	serve("/v1/config", func(s State) any { return s.Config })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		s := state()
		code := http.StatusOK
		if !s.Ready {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, Health{Ready: s.Ready, Reason: s.Reason})
	})
	// Liveness answers 200 whatever the cloud does: a daemon waiting for EC2
	// (start-up retries, throttled or failing pool growth) is alive and must
	// not be restarted for it. It still reads the state, so a daemon whose
	// lock is wedged stops answering and the probe's timeout catches it.
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) {
		s := state()
		writeJSON(w, http.StatusOK, Health{Ready: s.Ready, Reason: s.Reason})
	})
	return mux
}

// normalize replaces nil slices and maps with empty ones.
func normalize(s State) State {
	s.ENIs = append([]ENI{}, s.ENIs...) // a copy: the caller's slice stays as it was
	for i := range s.ENIs {
		if s.ENIs[i].Addresses == nil {
			s.ENIs[i].Addresses = []netip.Addr{}
		}
	}
	if s.Assignments == nil {
		s.Assignments = []Assignment{}
	}
	if s.Cooling == nil {
		s.Cooling = []CoolingAddress{}
	}
	if s.Config == nil {
		s.Config = map[string]string{}
	}
	return s
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away; nothing to do
}
