package awsprovider

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/smithy-go"

	"github.com/vpcip/vpcip/provider"
)

// TestClassify pins the code table; the contract suite provokes each code
// from vpcsim.
func TestClassify(t *testing.T) {
	tests := []struct {
		code    string
		want    error
		outcome string
	}{
		{"RequestLimitExceeded", provider.ErrThrottled, "throttled"},
		{"PrivateIpAddressLimitExceeded", provider.ErrAddressLimit, "address_limit"},
		{"AttachmentLimitExceeded", provider.ErrENILimit, "eni_limit"},
		{"InsufficientFreeAddressesInSubnet", provider.ErrSubnetFull, "subnet_full"},
		{"InsufficientCidrBlocks", provider.ErrInsufficientCIDR, "insufficient_cidr"},
		{"InvalidNetworkInterfaceID.NotFound", provider.ErrNotFound, "not_found"},
		{"InvalidSubnetID.NotFound", provider.ErrNotFound, "not_found"},
		{"InvalidInstanceType", provider.ErrNotFound, "not_found"},
		{"UnauthorizedOperation", provider.ErrUnauthorized, "unauthorized"},
		{"InvalidIPAddress.InUse", provider.ErrAddressInUse, "address_in_use"},
		{"InvalidParameterValue", nil, "error"},
	}
	for _, tt := range tests {
		apiErr := &smithy.GenericAPIError{Code: tt.code, Message: "text from EC2"}
		err := classify("AssignPrivateIpAddresses", apiErr)
		if tt.want != nil && !errors.Is(err, tt.want) {
			t.Errorf("classify(%s) = %v, want %v", tt.code, err, tt.want)
		}
		var back smithy.APIError
		if !errors.As(err, &back) || back.ErrorCode() != tt.code {
			t.Errorf("classify(%s) lost the API error: %v", tt.code, err)
		}
		if !strings.Contains(err.Error(), "AssignPrivateIpAddresses") || !strings.Contains(err.Error(), "text from EC2") {
			t.Errorf("classify(%s) message %q lacks the action or EC2's text", tt.code, err)
		}
		if got := outcome(err); got != tt.outcome {
			t.Errorf("outcome(%s) = %q, want %q", tt.code, got, tt.outcome)
		}
	}
	if err := classify("X", context.Canceled); !errors.Is(err, context.Canceled) || outcome(err) != "error" {
		t.Errorf("classify(context.Canceled) = %v", err)
	}
}
