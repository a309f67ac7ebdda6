package plugin

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcip/vpcip/ipamd/api"
)

func TestDaemonError(t *testing.T) {
	key := api.Key{Network: "vpcip", ContainerID: "c1", IfName: "eth0"}
	msg := "no free address: node at its ENI limit (3 of 3) and all 27 addresses assigned"
	tests := []struct {
		name    string
		err     error
		code    uint
		wantMsg string
	}{
		{"no address is retryable and keeps the daemon's words",
			&api.Error{Code: api.CodeNoAddress, Cause: api.CauseENILimit, Message: msg}, types.ErrTryAgainLater, msg},
		{"not ready is retryable", &api.Error{Code: api.CodeNotReady, Message: "restoring checkpoint"}, types.ErrTryAgainLater, "restoring checkpoint"},
		{"unreachable is retryable", fmt.Errorf("%w at /run/x.sock: connection refused", api.ErrUnreachable), types.ErrTryAgainLater,
			"vpcipd assign for vpcip/c1/eth0: vpcipd unreachable at /run/x.sock: connection refused"},
		{"deadline is retryable", context.DeadlineExceeded, types.ErrTryAgainLater, "vpcipd assign for vpcip/c1/eth0: context deadline exceeded"},
		{"internal is final", &api.Error{Code: api.CodeInternal, Message: "checkpoint write failed"}, types.ErrInternal, "checkpoint write failed"},
		{"invalid is final", &api.Error{Code: api.CodeInvalid, Message: "unknown version v9"}, types.ErrInternal, "unknown version v9"},
		{"other", errors.New("boom"), types.ErrInternal, "vpcipd assign for vpcip/c1/eth0: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := daemonError("assign", key, tt.err)
			if got.Code != tt.code || got.Msg != tt.wantMsg {
				t.Errorf("got %d %q, want %d %q", got.Code, got.Msg, tt.code, tt.wantMsg)
			}
		})
	}
}

// TestDaemonDown: the daemon errors after which DEL succeeds without it
// (B13): unreachable, late, not ready; not an answer that refused.
func TestDaemonDown(t *testing.T) {
	for _, tt := range []struct {
		err  error
		down bool
	}{
		{fmt.Errorf("%w at /run/x.sock: connection refused", api.ErrUnreachable), true},
		{fmt.Errorf("release: %w", context.DeadlineExceeded), true},
		{&api.Error{Code: api.CodeNotReady, Message: "restoring checkpoint"}, true},
		{&api.Error{Code: api.CodeInternal, Message: "checkpoint write failed"}, false},
		{&api.Error{Code: api.CodeNoAddress, Message: "no free address"}, false},
		{errors.New("boom"), false},
	} {
		if got := daemonDown(tt.err); got != tt.down {
			t.Errorf("daemonDown(%v) = %v, want %v", tt.err, got, tt.down)
		}
	}
}
