package vpcsim

import (
	"net/netip"
	"slices"
	"testing"
)

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"abc", "abc", true},     // literal
		{"abc", "abd", false},    // one character differs
		{"a*", "a", true},        // star matches nothing
		{"*", "", true},          // star matches the empty string
		{"a*c", "abbbc", true},   // star in the middle
		{"a*c", "abbbd", false},  // wrong last character
		{"a?c", "abc", true},     // one-character wildcard
		{"a?c", "ac", false},     // ? needs a character
		{"*x", "*ax", true},      // a literal star in the value
		{"i-*", "i-0123", true},  // EC2-style id prefix
		{"*b*b*", "abcab", true}, // backtracking
		{"*b*b*", "abca", false}, // backtracking fails
		{"", "", true},           // empty pattern
		{"", "a", false},         // empty pattern, non-empty value
		{"??", "a", false},       // too short
		{"**a", "bba", true},     // repeated stars
		{"vpcip*", "vpcip pool", true},
	}
	for _, tt := range tests {
		if got := globMatch(tt.pattern, tt.s); got != tt.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tt.pattern, tt.s, got, tt.want)
		}
	}
}

func TestPaginate(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e"}
	var pages [][]string
	token := ""
	for {
		page, next, err := paginate(ids, 2, token)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, page)
		if next == "" {
			break
		}
		token = next
	}
	if len(pages) != 3 || !slices.Equal(slices.Concat(pages...), ids) {
		t.Fatalf("pages %v", pages)
	}
	// A token whose item was deleted meanwhile resumes at the next one.
	_, next, _ := paginate(ids, 2, "")
	page, _, err := paginate([]string{"a", "b", "d", "e"}, 2, next)
	if err != nil || !slices.Equal(page, []string{"d", "e"}) {
		t.Fatalf("resume after deletion: %v %v", page, err)
	}
	if all, next, _ := paginate(ids, 0, ""); len(all) != 5 || next != "" {
		t.Fatalf("no MaxResults: %v %q", all, next)
	}
	if _, _, err := paginate(ids, 2, "%%%"); err == nil || err.Code != "InvalidPaginationToken" {
		t.Fatalf("bad token: %v", err)
	}
}

func TestSubnetAllocation(t *testing.T) {
	s := newSubnet("subnet-1", mustPrefix("10.0.0.0/26"), "az", nil)
	if s.free != 64-5 {
		t.Fatalf("free %d", s.free)
	}
	got := s.takeAddrs(2)
	if got[0].String() != "10.0.0.4" || got[1].String() != "10.0.0.5" {
		t.Fatalf("first addresses %v (after the four reserved)", got)
	}
	// .0/28 is partly taken and .48/28 holds the broadcast address, so two
	// prefixes fit: .16/28 and .32/28.
	ps := s.takePrefixes(2)
	if len(ps) != 2 || ps[0].String() != "10.0.0.16/28" || ps[1].String() != "10.0.0.32/28" {
		t.Fatalf("prefixes %v", ps)
	}
	if s.takePrefixes(1) != nil {
		t.Fatal("a third /28 in a /26")
	}
	if s.takeAddrs(100) != nil || s.free != 64-5-2-32 {
		t.Fatalf("an impossible take changed the subnet: %d free", s.free)
	}
	s.releasePrefix(ps[0])
	s.release(got[0])
	s.release(s.addrAt(0)) // reserved: stays held
	if s.free != 64-5-1-16 || !s.used[0] {
		t.Fatalf("after release: %d free", s.free)
	}
	if s.gateway().String() != "10.0.0.1" {
		t.Fatalf("gateway %s", s.gateway())
	}
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
