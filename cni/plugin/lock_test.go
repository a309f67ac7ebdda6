package plugin

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcip/vpcip/ipamd/api"
)

// TestLockAttachment: a second holder of one attachment's lock waits and
// gives up with errLockWait, and so does another sandbox of the same pod
// (another container ID, the same host veth); once the first lets go the
// second gets the lock; an attachment of another pod and other buckets
// does not wait; a directory that cannot be made runs without the lock,
// reported in skipped.
func TestLockAttachment(t *testing.T) {
	dir := t.TempDir()
	k := api.Key{Network: "n", ContainerID: "c1", IfName: "eth0"}
	names := lockNames(k, "enipod")
	unlock, skipped, err := lockAttachment(dir, names, time.Second)
	if err != nil || skipped != nil {
		t.Fatalf("first lock: %v, %v", skipped, err)
	}
	began := time.Now()
	if _, _, err := lockAttachment(dir, names, 100*time.Millisecond); !errors.Is(err, errLockWait) {
		t.Fatalf("second lock while held: %v; want errLockWait", err)
	}
	sibling := lockNames(api.Key{Network: "n", ContainerID: "c2", IfName: "eth0"}, "enipod")
	if _, _, err := lockAttachment(dir, sibling, 100*time.Millisecond); !errors.Is(err, errLockWait) {
		t.Fatalf("another sandbox of the pod while held: %v; want errLockWait", err)
	}
	if waited := time.Since(began); waited < 100*time.Millisecond {
		t.Errorf("gave up after %v, before its wait", waited)
	}
	var other []string
	for i := 0; ; i++ {
		other = lockNames(api.Key{Network: "n", ContainerID: "c" + string(rune('a'+i%26)) + string(rune('a'+i/26)), IfName: "eth0"}, "eniother"+string(rune('a'+i%26)))
		if b := []uint16{bucketOf(names[0]), bucketOf(names[1])}; !slices.Contains(b, bucketOf(other[0])) && !slices.Contains(b, bucketOf(other[1])) {
			break
		}
	}
	u2, _, err := lockAttachment(dir, other, 0)
	if err != nil {
		t.Fatalf("another bucket's lock: %v", err)
	}
	u2()
	got := make(chan error, 1)
	go func() {
		u, _, err := lockAttachment(dir, names, 5*time.Second)
		if err == nil {
			u()
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	unlock()
	if err := <-got; err != nil {
		t.Fatalf("lock after the holder let go: %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	u3, skipped, err := lockAttachment(filepath.Join(file, "locks"), names, time.Second)
	if err != nil || skipped == nil {
		t.Fatalf("lock under a file: skipped %v, err %v; want skipped and no error", skipped, err)
	}
	u3()
}

// TestStartTakesTheAttachmentLock: ADD, DEL and CHECK of an attachment
// whose lock is held wait, then fail with code 11 (try again later); GC
// and STATUS take no lock.
func TestStartTakesTheAttachmentLock(t *testing.T) {
	dir := t.TempDir()
	conf, _ := json.Marshal(map[string]any{
		"cniVersion": "1.1.0", "name": "n", "type": "vpcip-cni",
		"ipamdSocket": filepath.Join(dir, "ipamd.sock"), "pluginLogFile": filepath.Join(dir, "plugin.log"),
		"timeouts":                  map[string]string{"assign": "50ms", "release": "50ms", "check": "50ms"},
		"cni.dev/valid-attachments": []map[string]string{},
	})
	args := &skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: "/var/run/netns/x", StdinData: conf}
	// The attachment's own lock; the invocations also want their veth's.
	unlock, _, err := lockAttachment(lockDir(filepath.Join(dir, "ipamd.sock")), lockNames(api.Key{Network: "n", ContainerID: "c1", IfName: "eth0"}, "")[:1], time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"ADD", "DEL", "CHECK"} {
		_, err := start(cmd, args, true)
		var te *types.Error
		if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater {
			t.Errorf("%s while the lock is held: %v; want code 11", cmd, err)
		}
	}
	unlock()
	var te *types.Error
	// Another sandbox of the pod (another container ID) holding the veth's
	// lock: the invocation waits for it too.
	gc, err := start("GC", args, true)
	if err != nil {
		t.Fatal(err)
	}
	veth, _ := gc.vethNames()
	gc.close()
	unlockVeth, _, err := lockAttachment(lockDir(filepath.Join(dir, "ipamd.sock")), lockNames(api.Key{Network: "n", ContainerID: "c2", IfName: "eth0"}, veth)[1:], time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer unlockVeth()
	if _, err := start("ADD", args, true); !errors.As(err, &te) || te.Code != types.ErrTryAgainLater {
		t.Errorf("ADD while another sandbox of the pod holds its veth's lock: %v; want code 11", err)
	}
	for _, cmd := range []string{"GC", "STATUS"} {
		in, err := start(cmd, args, true)
		if err != nil {
			t.Errorf("%s while the lock is held: %v", cmd, err)
			continue
		}
		in.close()
	}
}
