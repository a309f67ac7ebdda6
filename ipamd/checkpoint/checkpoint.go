// Package checkpoint persists vpcipd's allocations: which attachment key
// holds which address, and when released addresses left their pods (so
// IP_COOLDOWN_PERIOD survives a restart).
//
// The file is versioned JSON, rewritten atomically on every change: a temp
// file in the same directory, fsync, rename over the old file, fsync of the
// directory. A reader therefore sees the old or the new file, never a mix.
// Load never trusts a damaged file: an empty, NUL-filled, truncated, invalid
// or unknown-version file is reported as a *CorruptError so the daemon can move
// it aside (Quarantine) and rebuild from the cloud and the host.
package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
)

// Version is the schema version this package writes and reads.
const Version = 1

// maxSize bounds what Load reads: 250 pods take about 60 KiB.
const maxSize = 16 << 20

// State is the checkpoint's content.
type State struct {
	Version    int       `json:"version"`
	InstanceID string    `json:"instanceID,omitempty"` // the instance that wrote it
	Written    time.Time `json:"written"`
	// Writer is the daemon that wrote the file (Save fills it in), so a
	// restore can tell a file another build left behind.
	Writer Writer `json:"writer,omitzero"`
	// Generation counts the changes recorded in this file over its life: a
	// restored store continues from it, so a copy of an older file has a
	// lower generation than the host state that outlived it.
	Generation  uint64       `json:"generation,omitempty"`
	Assignments []Assignment `json:"assignments"`
	Cooling     []Cooling    `json:"cooling,omitempty"`
	// Departed are addresses that left the node (released to EC2, their
	// ENI deleted, gone from the cloud's view) before their conntrack
	// entries were flushed: a restarted daemon flushes them first, as the
	// one that wrote the file was about to. Files of daemons before it
	// have none (and such daemons ignore it).
	Departed []netip.Addr `json:"departed,omitempty"`
	// Unknown holds the top-level fields of the loaded file this reader
	// does not know, by name, as they were: Save writes them back
	// unchanged. Fields are added to version 1 without a version bump (as
	// "departed" was), so a reader of the same version, an older build
	// after a rollback, must not drop what a newer one wrote. A field added
	// that way must therefore stay safe to carry unchanged by a build that
	// does not understand it; one that would not needs a new Version.
	Unknown map[string]json.RawMessage `json:"-"`
}

// Assignment is one address held by one attachment key.
type Assignment struct {
	Key        api.Key    `json:"key"`
	Pod        api.Pod    `json:"pod"`
	Address    netip.Addr `json:"address"`
	ENI        string     `json:"eni,omitempty"`
	AssignedAt time.Time  `json:"assignedAt"`
	// Recovered: rebuilt from a host pod route after the checkpoint was lost;
	// the real key is unknown and HostVeth names the pod's host interface.
	Recovered bool   `json:"recovered,omitempty"`
	HostVeth  string `json:"hostVeth,omitempty"`
	// Netns is the sandbox's netns path as ADD gave it (CNI_NETNS).
	Netns string `json:"netns,omitempty"`
}

// Cooling is a free address released at UnassignedAt.
type Cooling struct {
	Address      netip.Addr `json:"address"`
	ENI          string     `json:"eni,omitempty"`
	UnassignedAt time.Time  `json:"unassignedAt"`
}

// CorruptError says why a checkpoint file cannot be trusted.
type CorruptError struct {
	Path   string
	Reason string // "empty file", "NUL bytes", "invalid JSON: ...", "unknown version 7", ...
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("checkpoint %s is corrupt: %s", e.Path, e.Reason)
}

// Load reads the checkpoint at path. A missing file returns an error
// satisfying errors.Is(err, fs.ErrNotExist): a new node. A damaged file returns
// a *CorruptError. Entries that are individually invalid (bad address, empty
// container ID, an address or key listed twice) are dropped and described in
// dropped, while the rest of the file is used.
func Load(path string) (st State, dropped []string, err error) {
	removeTemps(path)
	f, err := os.Open(path)
	if err != nil {
		return State{}, nil, err
	}
	defer f.Close()
	data, err := readAll(f)
	if err != nil {
		return State{}, nil, fmt.Errorf("read checkpoint %s: %w", path, err)
	}
	if reason := damage(data); reason != "" {
		return State{}, nil, &CorruptError{Path: path, Reason: reason}
	}
	var raw rawState
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return State{}, nil, &CorruptError{Path: path, Reason: "invalid JSON: " + err.Error()}
	}
	if dec.More() {
		return State{}, nil, &CorruptError{Path: path, Reason: "trailing data after the JSON document"}
	}
	if raw.Version != Version {
		return State{}, nil, &CorruptError{Path: path, Reason: fmt.Sprintf("unknown version %d (this daemon reads %d)", raw.Version, Version)}
	}
	if raw.Assignments == nil {
		// Save always writes the list, empty or not: a file without it was
		// not written by this daemon and carries no release times either.
		return State{}, nil, &CorruptError{Path: path, Reason: `no "assignments" list`}
	}
	st = State{Version: raw.Version, InstanceID: raw.InstanceID, Written: raw.Written, Writer: raw.Writer, Generation: raw.Generation}
	if st.Unknown = unknownFields(data); st.Unknown == nil && hasUnknown(data) {
		dropped = append(dropped, fmt.Sprintf("fields this daemon does not know, more than %d bytes together: not carried", maxUnknown))
	}
	st.Assignments, dropped = decodeEntries[Assignment](raw.Assignments, "assignment", dropped)
	st.Cooling, dropped = decodeEntries[Cooling](raw.Cooling, "cooldown record", dropped)
	st.Departed, dropped = decodeEntries[netip.Addr](raw.Departed, "departed address", dropped)
	st.Departed, dropped = validDeparted(st.Departed, dropped)
	var more []string
	st.Assignments, st.Cooling, more = validate(st.Assignments, st.Cooling)
	return st, append(dropped, more...), nil
}

// rawState is State with its entries left undecoded, so one bad entry costs
// only itself.
type rawState struct {
	Version     int               `json:"version"`
	InstanceID  string            `json:"instanceID"`
	Written     time.Time         `json:"written"`
	Writer      Writer            `json:"writer"`
	Generation  uint64            `json:"generation"`
	Assignments []json.RawMessage `json:"assignments"`
	Cooling     []json.RawMessage `json:"cooling"`
	Departed    []json.RawMessage `json:"departed"`
}

// knownFields are the top-level names State reads and writes.
var knownFields = []string{"version", "instanceID", "written", "writer", "generation", "assignments", "cooling", "departed"}

// known reports whether State reads the top-level field k. encoding/json
// matches names without regard to case, so "Cooling" is State's cooling
// list too and must not also be carried as a field State does not know.
func known(k string) bool {
	return slices.ContainsFunc(knownFields, func(f string) bool { return strings.EqualFold(f, k) })
}

// maxUnknown bounds the fields a reader carries without knowing them
// (bytes, all together): a newer build's additions are small, and carrying
// more on every write would slow each ADD and DEL and could push the file
// past maxSize, which Load refuses.
const maxUnknown = 64 << 10

// unknownFields returns the top-level fields of a decoded-valid file that
// State does not know (State.Unknown), or nil; nil too when together they
// exceed maxUnknown (they are dropped, and the caller says so).
func unknownFields(data []byte) map[string]json.RawMessage {
	var all map[string]json.RawMessage
	if json.Unmarshal(data, &all) != nil {
		return nil
	}
	var out map[string]json.RawMessage
	size := 0
	for k, v := range all {
		if !known(k) {
			if size += len(k) + len(v); size > maxUnknown {
				return nil
			}
			if out == nil {
				out = map[string]json.RawMessage{}
			}
			out[k] = v
		}
	}
	return out
}

// hasUnknown reports whether data has a top-level field State does not know.
func hasUnknown(data []byte) bool {
	var all map[string]json.RawMessage
	if json.Unmarshal(data, &all) != nil {
		return false
	}
	for k := range all {
		if !known(k) {
			return true
		}
	}
	return false
}

// withUnknown adds st.Unknown's fields to data, the encoding of st; a
// field State knows is always written from State.
func withUnknown(data []byte, unknown map[string]json.RawMessage) ([]byte, error) {
	if len(unknown) == 0 {
		return data, nil
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return nil, err
	}
	for k, v := range unknown {
		if _, set := all[k]; !set && !known(k) && json.Valid(v) {
			all[k] = v
		}
	}
	return json.Marshal(all)
}

func decodeEntries[T any](raws []json.RawMessage, what string, dropped []string) ([]T, []string) {
	out := make([]T, 0, len(raws))
	for i, r := range raws {
		var v T
		if err := json.Unmarshal(r, &v); err != nil {
			dropped = append(dropped, fmt.Sprintf("%s #%d: %v", what, i, err))
			continue
		}
		out = append(out, v)
	}
	return out, dropped
}

func readAll(f *os.File) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxSize {
		return nil, fmt.Errorf("larger than %d bytes", maxSize)
	}
	return data, nil
}

// damage names what makes data unusable before JSON decoding, or "".
func damage(data []byte) string {
	switch {
	case len(bytes.TrimSpace(data)) == 0:
		return "empty file"
	case bytes.IndexByte(data, 0) >= 0:
		return fmt.Sprintf("NUL bytes (%d of %d bytes)", bytes.Count(data, []byte{0}), len(data))
	}
	return ""
}

// validate drops entries that cannot be used and says why. An address or a
// key listed twice drops every entry that lists it: the file cannot say which
// is right, and keeping the first could hand one pod's address to another's
// key. The daemon re-holds such addresses from the host's pod routes.
func validate(as []Assignment, cs []Cooling) ([]Assignment, []Cooling, []string) {
	var dropped []string
	addrs, keys := map[netip.Addr]int{}, map[api.Key]int{}
	for _, a := range as {
		addrs[a.Address]++
		keys[a.Key]++
	}
	seenAddr := map[netip.Addr]bool{}
	okA := as[:0]
	for _, a := range as {
		switch {
		case !PodAddress(a.Address):
			dropped = append(dropped, fmt.Sprintf("assignment of %s: address %q is neither IPv4 nor global IPv6", a.Key, a.Address))
		case a.Key.ContainerID == "":
			dropped = append(dropped, fmt.Sprintf("assignment of %s: empty container ID", a.Address))
		case addrs[a.Address] > 1:
			dropped = append(dropped, fmt.Sprintf("assignment of %s to %s: address listed %d times", a.Address, a.Key, addrs[a.Address]))
		case keys[a.Key] > 1:
			dropped = append(dropped, fmt.Sprintf("assignment of %s to %s: key listed %d times", a.Address, a.Key, keys[a.Key]))
		default:
			seenAddr[a.Address] = true
			okA = append(okA, a)
		}
	}
	okC := cs[:0]
	for _, c := range cs {
		if !PodAddress(c.Address) || seenAddr[c.Address] {
			dropped = append(dropped, fmt.Sprintf("cooldown record of %q: invalid or already assigned", c.Address))
			continue
		}
		seenAddr[c.Address] = true
		okC = append(okC, c)
	}
	return okA, okC, dropped
}

// PodAddress reports whether a can be a pod's address in a checkpoint: IPv4,
// or an IPv6 unicast address that is not link-local (a pod's address from
// the node's /80 in IPv6 mode), without a zone.
func PodAddress(a netip.Addr) bool {
	return a.Is4() || (a.Is6() && !a.Is4In6() && a.Zone() == "" && a.IsGlobalUnicast())
}

// validDeparted keeps the pod departed addresses (PodAddress), each once.
func validDeparted(ds []netip.Addr, dropped []string) ([]netip.Addr, []string) {
	seen := map[netip.Addr]bool{}
	ok := ds[:0]
	for _, d := range ds {
		if !PodAddress(d) || seen[d] {
			dropped = append(dropped, fmt.Sprintf("departed address %q: invalid or listed twice", d))
			continue
		}
		seen[d] = true
		ok = append(ok, d)
	}
	if len(ok) == 0 {
		return nil, dropped
	}
	return ok, dropped
}

// ErrNotDurable: Save renamed the new file into place, so readers see it,
// but the directory's fsync failed, so a power loss could bring back the
// old one. The state written is the file's state: a caller must not undo
// the change it recorded (an ADD rolled back would free an address the file
// still gives its pod).
var ErrNotDurable = errors.New("checkpoint written but not durable")

// syncDirHook is syncDir, replaced in tests to fail.
var syncDirHook = syncDir

// Save writes st to path atomically: temp file in the same directory, fsync,
// rename, fsync of the directory. The directory is created (0700) if missing.
// st.Unknown's fields are written back beside State's own.
// A failure before the rename leaves the old file; one after it is
// ErrNotDurable.
func Save(path string, st State) error {
	st.Version = Version
	if st.Writer == (Writer{}) {
		st.Writer = Self()
	}
	if st.Assignments == nil {
		st.Assignments = []Assignment{}
	}
	data, err := json.Marshal(st)
	if err == nil {
		data, err = withUnknown(data, st.Unknown)
	}
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, tempPrefix(path)+"*")
	if err != nil {
		return fmt.Errorf("checkpoint temp file: %w", err)
	}
	name := tmp.Name()
	if err := writeSync(tmp, data); err != nil {
		os.Remove(name)
		return fmt.Errorf("write checkpoint %s: %w", name, err)
	}
	if err := os.Rename(name, path); err != nil {
		os.Remove(name)
		return fmt.Errorf("replace checkpoint %s: %w", path, err)
	}
	if err := syncDirHook(dir); err != nil {
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	return nil
}

func writeSync(f *os.File, data []byte) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open checkpoint directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync checkpoint directory %s: %w", dir, err)
	}
	return nil
}

func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// removeTemps deletes temp files a crash left between create and rename.
func removeTemps(path string) {
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix(path)) {
			os.Remove(filepath.Join(filepath.Dir(path), e.Name()))
		}
	}
}

// Quarantine moves a damaged checkpoint aside to
// "<path>.corrupt-<UTC time>" and returns the new name.
func Quarantine(path string, now time.Time) (string, error) {
	to := path + ".corrupt-" + now.UTC().Format("20060102T150405.000Z")
	if err := os.Rename(path, to); err != nil {
		return "", fmt.Errorf("move corrupt checkpoint aside: %w", err)
	}
	return to, syncDir(filepath.Dir(path))
}
