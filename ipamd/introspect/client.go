package introspect

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Fetch reads the daemon's State from GET <baseURL>/v1/state. baseURL is
// "http://host:port" or just "host:port" (http is assumed). It uses
// http.DefaultClient; give ctx a deadline. A non-200 answer is an error
// carrying the status and the start of the body.
func Fetch(ctx context.Context, baseURL string) (State, error) {
	var s State
	err := get(ctx, http.DefaultClient, baseURL, "/v1/state", &s)
	return s, err
}

// get decodes the JSON body of GET base+path into v.
func get(ctx context.Context, c *http.Client, base, path string, v any) error {
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	url := strings.TrimSuffix(base, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("introspection request %s: %w", url, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("introspection GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("introspection GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("introspection GET %s: decode: %w", url, err)
	}
	return nil
}
