package vpcsim

import (
	"encoding/base64"
	"slices"
	"strings"
)

// fieldFunc returns a resource's values for a filter name, and false when
// the name is not a filter of that resource kind.
type fieldFunc func(name string) ([]string, bool)

// tagField answers the tag filters common to every resource kind:
// "tag:<key>" (the tag's value), "tag-key" and "tag-value".
func tagField(tags map[string]string, name string) ([]string, bool) {
	if k, ok := strings.CutPrefix(name, "tag:"); ok {
		if v, has := tags[k]; has {
			return []string{v}, true
		}
		return nil, true
	}
	switch name {
	case "tag-key":
		keys := make([]string, 0, len(tags))
		for k := range tags {
			keys = append(keys, k)
		}
		return keys, true
	case "tag-value":
		vals := make([]string, 0, len(tags))
		for _, v := range tags {
			vals = append(vals, v)
		}
		return vals, true
	}
	return nil, false
}

// checkFilters rejects filter names the resource kind does not know, as EC2
// does (InvalidParameterValue), using probe to ask.
func checkFilters(fs []filter, probe fieldFunc) *Error {
	for _, f := range fs {
		if _, ok := probe(f.name); !ok {
			return errorf("InvalidParameterValue", "The filter '%s' is invalid", f.name)
		}
	}
	return nil
}

// matches reports whether a resource passes every filter: a filter passes
// when any of its values matches any of the resource's values for it.
func matches(fs []filter, field fieldFunc) bool {
	for _, f := range fs {
		have, _ := field(f.name)
		ok := false
		for _, want := range f.values {
			for _, h := range have {
				ok = ok || globMatch(want, h)
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// globMatch matches s against an EC2 filter value, where '*' matches any run
// of characters and '?' any one character. It runs in O(len(p)·len(s)).
func globMatch(p, s string) bool {
	px, sx := 0, 0
	starP, starS := -1, 0
	for sx < len(s) {
		switch {
		case px < len(p) && p[px] == '*':
			starP, starS = px, sx
			px++
		case px < len(p) && (p[px] == '?' || p[px] == s[sx]):
			px++
			sx++
		case starP >= 0:
			starS++
			px, sx = starP+1, starS
		default:
			return false
		}
	}
	for px < len(p) && p[px] == '*' {
		px++
	}
	return px == len(p)
}

// paginate returns the page of the sorted ids that starts at token and holds
// at most maxResults (0 = all), and the token of the next page ("" = last).
// Tokens are opaque to clients: the base64 of the first id of the page.
func paginate(ids []string, maxResults int, token string) ([]string, string, *Error) {
	start := 0
	if token != "" {
		raw, err := base64.RawURLEncoding.DecodeString(token)
		if err != nil || len(raw) == 0 {
			return nil, "", errorf("InvalidPaginationToken", "Invalid pagination token %q.", token)
		}
		start, _ = slices.BinarySearch(ids, string(raw))
	}
	end := len(ids)
	if maxResults > 0 && start+maxResults < end {
		end = start + maxResults
	}
	next := ""
	if end < len(ids) {
		next = base64.RawURLEncoding.EncodeToString([]byte(ids[end]))
	}
	return ids[start:end], next, nil
}
