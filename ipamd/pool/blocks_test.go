package pool

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func ips(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func set(ss ...string) map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	for _, a := range ips(ss...) {
		m[a] = true
	}
	return m
}

var subnet20 = netip.MustParsePrefix("10.0.0.0/20")

func TestPickRelease(t *testing.T) {
	tests := []struct {
		name   string
		free   []netip.Addr
		n      int
		held   []netip.Addr // besides free
		others map[netip.Addr]bool
		want   []netip.Addr
	}{
		{
			// Address order would give back .20 and .21; .40 and .41 are
			// the node's only addresses in .32/28 and nobody else's: that
			// block becomes whole.
			name: "a block becomes whole", free: ips("10.0.0.20", "10.0.0.21", "10.0.0.40", "10.0.0.41"), n: 2,
			held: ips("10.0.0.22"), others: set("10.0.0.4"), want: ips("10.0.0.40", "10.0.0.41"),
		},
		{
			// .48/28 is emptied of the node's addresses in either case, but
			// another ENI holds .50: .64/28 (two addresses) is the one that
			// becomes whole, preferred over the cheaper .48/28 (one).
			name: "others' addresses keep a block broken", free: ips("10.0.0.49", "10.0.0.65", "10.0.0.66"), n: 2,
			others: set("10.0.0.50"), want: ips("10.0.0.65", "10.0.0.66"),
		},
		{
			// The block with the network and reserved addresses never
			// becomes whole.
			name: "reserved addresses keep a block broken", free: ips("10.0.0.5", "10.0.0.6", "10.0.0.80"), n: 1,
			others: set(), want: ips("10.0.0.80"),
		},
		{
			// Without a subnet view: leave the block where the node would
			// keep nothing (.80/28), not the one where a pod holds .97.
			name: "no view: pack the node's addresses", free: ips("10.0.0.96", "10.0.0.98", "10.0.0.81"), n: 1,
			held: ips("10.0.0.97"), want: ips("10.0.0.81"),
		},
		{
			// Without a view, no block the node could leave fits in n=2
			// (.112/28 holds three free ones): the two go toward leaving
			// it, not from the blocks where pods keep the node anyway.
			name: "no view: partial toward leaving a block", free: ips("10.0.0.112", "10.0.0.113", "10.0.0.114", "10.0.0.130", "10.0.0.150"), n: 2,
			held: ips("10.0.0.131", "10.0.0.132", "10.0.0.151"), want: ips("10.0.0.112", "10.0.0.113"),
		},
		{
			name: "n at least the free addresses: all", free: ips("10.0.0.9", "10.0.0.200", "10.0.0.9"), n: 5,
			want: ips("10.0.0.9", "10.0.0.200"),
		},
		{name: "n zero: none", free: ips("10.0.0.9"), n: 0, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			held := append(slices.Clone(tt.held), tt.free...)
			got := PickRelease(tt.free, tt.n, held, tt.others, subnet20)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("PickRelease = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPickAssign(t *testing.T) {
	// .16/28: others hold .16-.29 (14), two free; .32/28: the node holds
	// .33; the network block (.0/28) has its four reserved addresses and
	// others' .4.
	others := set("10.0.0.4")
	for a := netip.MustParseAddr("10.0.0.16"); a.Compare(netip.MustParseAddr("10.0.0.29")) <= 0; a = a.Next() {
		others[a] = true
	}
	held := ips("10.0.0.33")
	// The node's own broken block first: it refills its own holes.
	if got, want := PickAssign(2, held, others, subnet20, 0), ips("10.0.0.32", "10.0.0.34"); !slices.Equal(got, want) {
		t.Errorf("PickAssign(2) = %v, want the node's own block's %v", got, want)
	}
	// Seventeen: the own block's 15, then the fullest other block
	// (.16/28, 14 taken) before the network block (5 taken).
	want := ips("10.0.0.30", "10.0.0.31", "10.0.0.32")
	for i := 34; i < 48; i++ {
		want = append(want, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
	}
	if got := PickAssign(17, held, others, subnet20, 0); !slices.Equal(got, want) {
		t.Errorf("PickAssign(17) = %v, want %v", got, want)
	}
	// Without own addresses: fullest first.
	if got, want := PickAssign(3, nil, others, subnet20, 0), ips("10.0.0.5", "10.0.0.30", "10.0.0.31"); !slices.Equal(got, want) {
		t.Errorf("PickAssign(3) with no own address = %v, want %v", got, want)
	}
	// Salts spread equally full blocks: two nodes naming one address each
	// among ten blocks with six taken addresses each (fuller than the
	// network block's four reserved) rarely agree.
	tens := map[netip.Addr]bool{}
	for b := 1; b <= 10; b++ {
		for i := range 6 {
			tens[netip.AddrFrom4([4]byte{10, 0, 1, byte(16*b + i)})] = true
		}
	}
	agree := 0
	for salt := uint64(1); salt <= 50; salt++ {
		x, y := PickAssign(1, nil, tens, subnet20, salt), PickAssign(1, nil, tens, subnet20, salt+1000)
		if len(x) != 1 || len(y) != 1 {
			t.Fatalf("PickAssign(1) = %v, %v", x, y)
		}
		if x[0] == y[0] {
			agree++
		}
	}
	if agree > 15 {
		t.Errorf("differently salted picks agreed %d times in 50", agree)
	}
	if got := PickAssign(2, held, nil, subnet20, 0); got != nil {
		t.Errorf("PickAssign without a view = %v, want nil", got)
	}
	// A /27 subnet: .0/28 (reserved + .4), .16/28 (broadcast): 26 free in
	// broken blocks; 27 cannot be had.
	small := netip.MustParsePrefix("10.0.1.0/27")
	if got := PickAssign(26, nil, set("10.0.1.4"), small, 0); len(got) != 26 || slices.Contains(got, netip.MustParseAddr("10.0.1.31")) {
		t.Errorf("PickAssign(26) in a /27 = %v", got)
	}
	if got := PickAssign(27, nil, set("10.0.1.4"), small, 0); got != nil {
		t.Errorf("PickAssign(27) in a /27 with 26 free = %v, want nil", got)
	}
	// Nothing broken but the reserved blocks of a /20: whole blocks stay.
	if got := PickAssign(30, nil, set(), subnet20, 0); got != nil {
		for _, a := range got {
			if b := blockOf(a); b != blockOf(subnet20.Addr()) && b != blockOf(lastOf(subnet20)) {
				t.Fatalf("PickAssign broke the whole block %s: %v", b, got)
			}
		}
	}
}

// TestPickReleaseProperty: on random sets, PickRelease never names an
// address outside the free ones (so never one in use), returns min(n,
// free) distinct addresses, and with a view never leaves fewer whole /28s
// than address order would.
func TestPickReleaseProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 1))
	subnet := netip.MustParsePrefix("10.1.0.0/24")
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}) }
	for iter := range 3000 {
		var free, inUse []netip.Addr
		others := map[netip.Addr]bool{}
		for i := 4; i < 255; i++ {
			switch r := rng.IntN(10); {
			case r < 2:
				free = append(free, addr(i))
			case r < 3:
				inUse = append(inUse, addr(i))
			case r < 4:
				others[addr(i)] = true
			}
		}
		n := rng.IntN(len(free) + 2)
		var view map[netip.Addr]bool
		if iter%2 == 0 {
			view = others
		}
		held := append(slices.Clone(free), inUse...)
		got := PickRelease(free, n, held, view, subnet)
		if want := min(n, len(free)); len(got) != want {
			t.Fatalf("iter %d: %d picked, want %d", iter, len(got), want)
		}
		if len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Fatalf("iter %d: duplicates in %v", iter, got)
		}
		for _, a := range got {
			if !slices.Contains(free, a) {
				t.Fatalf("iter %d: picked %s, not free (in use: %v)", iter, a, slices.Contains(inUse, a))
			}
		}
		if view != nil {
			whole := func(released []netip.Addr) int {
				taken := map[netip.Addr]bool{}
				for _, a := range held {
					taken[a] = true
				}
				for a := range others {
					taken[a] = true
				}
				for _, a := range released {
					delete(taken, a)
				}
				w := 0
				for b := 16; b < 240; b += 16 { // blocks without reserved addresses
					ok := true
					for i := b; i < b+16; i++ {
						ok = ok && !taken[addr(i)]
					}
					if ok {
						w++
					}
				}
				return w
			}
			if w, base := whole(got), whole(free[:min(n, len(free))]); w < base {
				t.Fatalf("iter %d: %d whole /28s after the pick, %d after address order", iter, w, base)
			}
		}
	}
}

// TestPickAssignProperty: PickAssign names only addresses of the subnet
// that no one holds and EC2 does not reserve, n of them or none, and never
// one in a whole /28.
func TestPickAssignProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 2))
	subnet := netip.MustParsePrefix("10.2.0.0/24")
	for iter := range 2000 {
		others := map[netip.Addr]bool{}
		var held []netip.Addr
		for i := 0; i < 256; i++ {
			a := netip.AddrFrom4([4]byte{10, 2, 0, byte(i)})
			switch rng.IntN(12) {
			case 0:
				others[a] = true
			case 1:
				held = append(held, a)
			}
		}
		n := 1 + rng.IntN(20)
		got := PickAssign(n, held, others, subnet, rng.Uint64())
		if got != nil && len(got) != n {
			t.Fatalf("iter %d: %d named, want %d or none", iter, len(got), n)
		}
		for _, a := range got {
			if others[a] || slices.Contains(held, a) || reservedIn(subnet, a) || !subnet.Contains(a) {
				t.Fatalf("iter %d: named %s, which is held or reserved", iter, a)
			}
			b, broken := blockOf(a), false
			for x := b.Addr(); b.Contains(x); x = x.Next() {
				broken = broken || others[x] || slices.Contains(held, x) || reservedIn(subnet, x)
			}
			if !broken {
				t.Fatalf("iter %d: named %s in the whole block %s", iter, a, b)
			}
		}
	}
}
