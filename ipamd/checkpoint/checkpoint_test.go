package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vpcip/vpcip/ipamd/api"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func sample() State {
	return State{
		Version:    Version,
		InstanceID: "i-0123",
		Written:    t0,
		Writer:     Writer{Program: "vpcipd", Build: "v1.2.3 abc", PID: 42},
		Generation: 17,
		Assignments: []Assignment{
			{Key: api.Key{Network: "vpcip", ContainerID: "c1", IfName: "eth0"}, Pod: api.Pod{Namespace: "default", Name: "p1"},
				Address: netip.MustParseAddr("100.64.0.11"), ENI: "eni-a", AssignedAt: t0},
		},
		Cooling:  []Cooling{{Address: netip.MustParseAddr("100.64.0.12"), ENI: "eni-a", UnassignedAt: t0.Add(time.Second)}},
		Departed: []netip.Addr{netip.MustParseAddr("100.64.0.40")},
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "ipam.json")
	want := sample()
	if err := Save(path, want); err != nil {
		t.Fatal(err)
	}
	got, dropped, err := Load(path)
	if err != nil || len(dropped) != 0 {
		t.Fatalf("Load: %v, dropped %v", err, dropped)
	}
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d files after Save, want only the checkpoint", len(entries))
	}
	fi, _ := os.Stat(filepath.Dir(path))
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("checkpoint directory mode %v, want 0700", fi.Mode().Perm())
	}
}

func TestLoadMissingIsNotExist(t *testing.T) {
	_, _, err := Load(filepath.Join(t.TempDir(), "none.json"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err %v, want fs.ErrNotExist", err)
	}
}

// TestLoadCorruptKinds: every kind of damage is reported as corrupt with a
// reason, never decoded into a partial state (B34, B39).
func TestLoadCorruptKinds(t *testing.T) {
	good, _ := os.ReadFile(writeSample(t))
	tests := []struct {
		name, reason string
		data         []byte
	}{
		{"empty", "empty file", nil},
		{"whitespace", "empty file", []byte(" \n\t")},
		{"NUL-filled", "NUL bytes", bytes.Repeat([]byte{0}, 4096)},
		{"NUL tail", "NUL bytes", append(good[:len(good)/2:len(good)/2], bytes.Repeat([]byte{0}, 512)...)},
		{"truncated", "invalid JSON", good[:len(good)/2]},
		{"not JSON", "invalid JSON", []byte("hello")},
		{"wrong type", "invalid JSON", []byte(`{"version":"one"}`)},
		{"unknown version", "unknown version 7", []byte(`{"version":7,"assignments":[]}`)},
		{"no version", "unknown version 0", []byte(`{"assignments":[]}`)},
		{"two documents", "trailing data", append(append([]byte{}, good...), good...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ipam.json")
			if err := os.WriteFile(path, tt.data, 0o600); err != nil {
				t.Fatal(err)
			}
			st, _, err := Load(path)
			var ce *CorruptError
			if !errors.As(err, &ce) || !strings.Contains(ce.Reason, tt.reason) {
				t.Fatalf("Load = %+v, %v; want CorruptError with %q", st, err, tt.reason)
			}
			to, err := Quarantine(path, t0)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(to, ".corrupt-20261129T120000.000Z") {
				t.Errorf("quarantined to %s", to)
			}
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("corrupt file still at %s", path)
			}
			if kept, _ := os.ReadFile(to); !bytes.Equal(kept, tt.data) && len(tt.data) > 0 {
				t.Error("quarantined file differs from the corrupt one")
			}
		})
	}
}

func writeSample(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ipam.json")
	if err := Save(path, sample()); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLoadDropsBadEntriesKeepsGood: one damaged entry does not cost the
// others. An address listed for two keys (c1, c3) drops both: the file cannot
// say whose it is, and the daemon re-holds it from the host's pod routes.
func TestLoadDropsBadEntriesKeepsGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	data := `{"version":1,"assignments":[
	 {"key":{"network":"vpcip","containerID":"c1","ifName":"eth0"},"address":"100.64.0.11","assignedAt":"2026-11-29T12:00:00Z"},
	 {"key":{"network":"vpcip","containerID":"","ifName":"eth0"},"address":"100.64.0.12","assignedAt":"2026-11-29T12:00:00Z"},
	 {"key":{"network":"vpcip","containerID":"c3","ifName":"eth0"},"address":"100.64.0.11","assignedAt":"2026-11-29T12:00:00Z"},
	 {"key":{"network":"vpcip","containerID":"c4","ifName":"eth0"},"address":"","assignedAt":"2026-11-29T12:00:00Z"},
	 {"key":{"network":"vpcip","containerID":"c5","ifName":"eth0"},"address":"100.64.0.15","assignedAt":"2026-11-29T12:00:00Z"}],
	 "cooling":[{"address":"100.64.0.15","unassignedAt":"2026-11-29T12:00:00Z"},{"address":"100.64.0.16","unassignedAt":"2026-11-29T12:00:00Z"}]}`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	st, dropped, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range st.Assignments {
		got = append(got, a.Key.ContainerID+"="+a.Address.String())
	}
	if d := cmp.Diff([]string{"c5=100.64.0.15"}, got); d != "" {
		t.Errorf("kept assignments (-want +got):\n%s", d)
	}
	if len(st.Cooling) != 1 || st.Cooling[0].Address != netip.MustParseAddr("100.64.0.16") {
		t.Errorf("kept cooling %v", st.Cooling)
	}
	if len(dropped) != 5 {
		t.Errorf("dropped %d entries, want 5: %v", len(dropped), dropped)
	}
}

// TestLoadDeparted: departed addresses load, invalid or repeated ones are
// dropped alone, and a file without the list (an older daemon's) loads
// with none.
func TestLoadDeparted(t *testing.T) {
	tests := []struct {
		departed string
		want     []netip.Addr
		dropped  int
	}{
		{``, nil, 0}, // an older daemon's file
		{`,"departed":["100.64.0.40","100.64.0.41"]`, []netip.Addr{netip.MustParseAddr("100.64.0.40"), netip.MustParseAddr("100.64.0.41")}, 0},
		{`,"departed":["100.64.0.40","","fe80::1","100.64.0.40",7]`, []netip.Addr{netip.MustParseAddr("100.64.0.40")}, 4},
	}
	for _, tt := range tests {
		path := filepath.Join(t.TempDir(), "ipam.json")
		data := `{"version":1,"assignments":[]` + tt.departed + `}`
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		st, dropped, err := Load(path)
		if err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		if d := cmp.Diff(tt.want, st.Departed, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" || len(dropped) != tt.dropped {
			t.Errorf("%s: departed (-want +got):\n%s dropped %v, want %d", data, d, dropped, tt.dropped)
		}
	}
}

// TestLoadWithoutAssignmentsIsCorrupt: valid JSON of the right version but
// without the assignments list was not written by Save, and trusting it would
// lose every release time (cooldowns): it is reported corrupt.
func TestLoadWithoutAssignmentsIsCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	if err := os.WriteFile(path, []byte(`{"version":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := Load(path)
	var ce *CorruptError
	if !errors.As(err, &ce) {
		t.Fatalf("Load = %v, want a *CorruptError", err)
	}
	empty := filepath.Join(t.TempDir(), "ipam.json")
	if err := Save(empty, State{}); err != nil {
		t.Fatal(err)
	}
	if st, _, err := Load(empty); err != nil || len(st.Assignments) != 0 {
		t.Errorf("an empty state saved and loaded: %+v, %v", st, err)
	}
}

// TestLoadRemovesCrashLeftovers: a temp file from a crash between create and
// rename is removed and never read.
func TestLoadRemovesCrashLeftovers(t *testing.T) {
	path := writeSample(t)
	leftover := filepath.Join(filepath.Dir(path), ".ipam.json.tmp-123")
	if err := os.WriteFile(leftover, []byte("{half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Load(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leftover); !errors.Is(err, fs.ErrNotExist) {
		t.Error("temp leftover not removed")
	}
}

func TestSaveFailsCleanlyOnUnwritableDir(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	os.WriteFile(blocker, nil, 0o600)
	if err := Save(filepath.Join(blocker, "ipam.json"), sample()); err == nil {
		t.Fatal("Save under a regular file succeeded")
	}
}

func BenchmarkSave250(b *testing.B) {
	st := sample()
	for i := range 250 {
		a := st.Assignments[0]
		a.Key.ContainerID = strings.Repeat("f", 60) + string(rune('a'+i%26)) + string(rune('a'+i/26))
		a.Address = netip.AddrFrom4([4]byte{100, 64, byte(i / 200), byte(i%200 + 1)})
		st.Assignments = append(st.Assignments, a)
	}
	st.Assignments = st.Assignments[1:]
	path := filepath.Join(b.TempDir(), "ipam.json")
	for b.Loop() {
		if err := Save(path, st); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzLoad: no input panics Load; whatever it accepts survives a Save and
// Load unchanged, with no duplicate address or key.
func FuzzLoad(f *testing.F) {
	good, _ := json.Marshal(sample())
	f.Add(good)
	f.Add([]byte(`{"version":1,"assignments":[{"key":{"containerID":"c"},"address":"1.2.3.4"}]}`))
	f.Add([]byte{0, 0, 0})
	f.Add([]byte(`{"version":1,"assignments":[1,"x",null]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "ipam.json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		st, _, err := Load(path)
		if err != nil {
			return
		}
		addrs := map[netip.Addr]bool{}
		keys := map[api.Key]bool{}
		for _, a := range st.Assignments {
			if addrs[a.Address] || keys[a.Key] {
				t.Fatalf("Load accepted a duplicate: %+v", a)
			}
			addrs[a.Address], keys[a.Key] = true, true
		}
		if err := Save(path, st); err != nil {
			t.Fatal(err)
		}
		again, dropped, err := Load(path)
		if err != nil || len(dropped) > 0 {
			t.Fatalf("reload: %v %v", err, dropped)
		}
		if st.Writer == (Writer{}) {
			st.Writer = Self() // Save names the writer when the state does not
		}
		if d := cmp.Diff(st, again, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
			t.Fatalf("round trip (-first +second):\n%s", d)
		}
	})
}

// Save names the daemon that wrote the file when the state does not, so a
// restore can tell a file left by another build or process.
func TestSaveRecordsItsWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	st := sample()
	st.Writer = Writer{}
	if err := Save(path, st); err != nil {
		t.Fatal(err)
	}
	got, _, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Writer != Self() || got.Writer.PID != os.Getpid() || got.Writer.Build == "" || got.Generation != 17 {
		t.Errorf("writer %+v generation %d, want %+v and 17", got.Writer, got.Generation, Self())
	}
}

// TestSaveNotDurableAfterRename: a directory fsync that fails after the
// rename is ErrNotDurable, and the file already holds the new state (so a
// caller must not undo it); a failure before the rename is not.
func TestSaveNotDurableAfterRename(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	saved := syncDirHook
	t.Cleanup(func() { syncDirHook = saved })
	syncDirHook = func(string) error { return errors.New("input/output error") }
	st := sample()
	err := Save(path, st)
	if !errors.Is(err, ErrNotDurable) {
		t.Fatalf("Save with the directory fsync failing: %v, want ErrNotDurable", err)
	}
	got, _, lerr := Load(path)
	if lerr != nil || len(got.Assignments) != len(st.Assignments) {
		t.Errorf("file after a not-durable save: %d assignments, %v; want the new state's %d", len(got.Assignments), lerr, len(st.Assignments))
	}
}

// TestRoundTripKeepsWhatTheReaderDoesNotKnow: a file carrying departed
// addresses and a list a later build of the same schema version added
// (version stays 1, as it did for "departed") is read and written again
// with nothing lost: a reader of the schema never drops what it does not
// understand (a rollback to this build and forward again keeps both).
func TestRoundTripKeepsWhatTheReaderDoesNotKnow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	data := `{"version":1,"written":"2026-11-29T12:00:00Z","assignments":[],` +
		`"departed":["100.64.0.40","100.64.0.41"],"quarantined":[{"address":"100.64.0.42","until":"2026-11-29T13:00:00Z"}]}`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	st, dropped, err := Load(path)
	if err != nil || len(dropped) != 0 {
		t.Fatalf("Load: %v, dropped %v", err, dropped)
	}
	if err := Save(path, st); err != nil {
		t.Fatal(err)
	}
	again, _, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("100.64.0.40"), netip.MustParseAddr("100.64.0.41")}
	if d := cmp.Diff(want, again.Departed, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("departed after a round trip (-want +got):\n%s", d)
	}
	var raw map[string]json.RawMessage
	out, _ := os.ReadFile(path)
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatal(err)
	}
	if got, want := string(raw["quarantined"]), `[{"address":"100.64.0.42","until":"2026-11-29T13:00:00Z"}]`; got != want {
		t.Errorf("a field this reader does not know, after a round trip: %s, want %s (file: %s)", got, want, out)
	}
	// What this reader knows is written from State, never from the old
	// file: a known field is not duplicated or resurrected.
	st.Departed = nil
	if err := Save(path, st); err != nil {
		t.Fatal(err)
	}
	if again, _, _ := Load(path); len(again.Departed) != 0 {
		t.Errorf("departed cleared in State but written back from the file: %v", again.Departed)
	}
}

// TestUnknownFieldsBoundedAndCaseBlind: a field whose name differs from one
// State knows only in case is that field (encoding/json matches names
// without regard to case), so it is not carried as unknown and comes back
// after State dropped it; and unknown fields larger than maxUnknown are not
// carried (said in dropped), so a file Load accepts cannot grow on each
// write past what Load accepts.
func TestUnknownFieldsBoundedAndCaseBlind(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	data := `{"version":1,"written":"2026-11-29T12:00:00Z","assignments":[],` +
		`"Cooling":[{"address":"100.64.0.9","unassignedAt":"2026-11-29T11:59:00Z"}]}`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	st, _, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	st.Cooling = nil
	if err := Save(path, st); err != nil {
		t.Fatal(err)
	}
	if out, _ := os.ReadFile(path); strings.Contains(strings.ToLower(string(out)), `"cooling"`) {
		t.Errorf("a cooling list State emptied came back under another case: %s", out)
	}

	big := `{"version":1,"written":"2026-11-29T12:00:00Z","assignments":[],"future":"` + strings.Repeat("x", maxUnknown) + `"}`
	if err := os.WriteFile(path, []byte(big), 0o600); err != nil {
		t.Fatal(err)
	}
	st, dropped, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Unknown) != 0 || len(dropped) != 1 || !strings.Contains(dropped[0], "not carried") {
		t.Errorf("unknown fields over %d bytes: carried %d, dropped %q; want none carried and one line saying so", maxUnknown, len(st.Unknown), dropped)
	}
	if err := Save(path, st); err != nil {
		t.Fatal(err)
	}
	if out, _ := os.ReadFile(path); len(out) > maxUnknown {
		t.Errorf("file after a write: %d bytes, the large unknown field carried", len(out))
	}
}
