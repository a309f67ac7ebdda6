package ipamd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/vpcip/vpcip/ipamd/api"
)

// maxRequest bounds a request body; a GC list of 10,000 keys fits.
const maxRequest = 4 << 20

// apiHandler serves the plugin API (package api documents the endpoints).
func (s *apiServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/assign", func(w http.ResponseWriter, r *http.Request) {
		var req api.AssignRequest
		if !decode(w, r, &req, func() error { return errors.Join(checkKeyed(req.Version, req.Key), req.Pod.Check()) }) {
			return
		}
		a, err := s.Assign(r.Context(), req)
		reply(w, a, err)
	})
	mux.HandleFunc("POST /v1/release", func(w http.ResponseWriter, r *http.Request) {
		var req api.ReleaseRequest
		if !decode(w, r, &req, func() error { return checkKeyed(req.Version, req.Key) }) {
			return
		}
		resp, err := s.Release(req)
		reply(w, resp, err)
	})
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) {
		var req api.CheckRequest
		if !decode(w, r, &req, func() error { return errors.Join(checkKeyed(req.Version, req.Key), req.Pod.Check()) }) {
			return
		}
		a, err := s.Check(req)
		reply(w, a, err)
	})
	mux.HandleFunc("POST /v1/gc", func(w http.ResponseWriter, r *http.Request) {
		var req api.GCRequest
		if !decode(w, r, &req, func() error { return checkGC(req) }) {
			return
		}
		resp, err := s.GC(req)
		reply(w, resp, err)
	})
	mux.HandleFunc("POST /v1/gc/plan", func(w http.ResponseWriter, r *http.Request) {
		var req api.GCRequest
		if !decode(w, r, &req, func() error { return checkGC(req) }) {
			return
		}
		resp, err := s.GCPlan(req)
		reply(w, resp, err)
	})
	mux.HandleFunc("POST /v1/gc/release", func(w http.ResponseWriter, r *http.Request) {
		var req api.GCRequest
		if !decode(w, r, &req, func() error { return checkGC(req) }) {
			return
		}
		resp, err := s.GCRelease(req)
		reply(w, resp, err)
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, s.view.status(), nil)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, &api.Error{Version: api.Version, Code: api.CodeInvalid,
			Message: fmt.Sprintf("vpcipd: no endpoint %s %s (see package ipamd/api)", r.Method, r.URL.Path)})
	})
	return mux
}

// decode reads a JSON request and validates it with check; on failure it
// answers CodeInvalid and returns false.
func decode(w http.ResponseWriter, r *http.Request, into any, check func() error) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequest+1))
	if err == nil && len(body) > maxRequest {
		err = fmt.Errorf("larger than %d bytes", maxRequest)
	}
	if err == nil {
		err = json.Unmarshal(body, into)
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, invalid("malformed request: %v", err))
		return false
	}
	if err := check(); err != nil {
		writeJSON(w, http.StatusBadRequest, invalid("%v", err))
		return false
	}
	return true
}

func checkVersion(v string) error {
	if v != api.Version {
		return fmt.Errorf("unsupported protocol version %q (this daemon speaks %q)", v, api.Version)
	}
	return nil
}

// checkKeyed accepts a request of our version with a complete key.
func checkKeyed(version string, key api.Key) error {
	if err := checkVersion(version); err != nil {
		return err
	}
	return key.Check()
}

// checkGC accepts a GC of one named network whose valid keys belong to it.
func checkGC(req api.GCRequest) error {
	if err := checkVersion(req.Version); err != nil {
		return err
	}
	if req.Network == "" {
		return fmt.Errorf("GC without a network name")
	}
	for _, k := range req.Valid {
		if k.Network != req.Network {
			return fmt.Errorf("GC of network %q lists attachment %q of another network", req.Network, k.String())
		}
	}
	for _, t := range req.Release {
		if t.Key.Network != req.Network {
			return fmt.Errorf("GC of network %q would release attachment %q of another network", req.Network, t.Key.String())
		}
	}
	return nil
}

func invalid(format string, args ...any) *api.Error {
	return &api.Error{Version: api.Version, Code: api.CodeInvalid, Message: "vpcipd: " + fmt.Sprintf(format, args...)}
}

func reply(w http.ResponseWriter, v any, err error) {
	if err == nil {
		writeJSON(w, http.StatusOK, v)
		return
	}
	var e *api.Error
	if !errors.As(err, &e) {
		e = &api.Error{Code: api.CodeInternal, Message: "vpcipd: " + err.Error()}
	}
	e.Version = api.Version
	status := http.StatusInternalServerError
	switch e.Code {
	case api.CodeNoAddress, api.CodeNotReady:
		status = http.StatusServiceUnavailable
	case api.CodeNotFound:
		status = http.StatusNotFound
	case api.CodeInvalid:
		status = http.StatusBadRequest
	}
	writeJSON(w, status, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
