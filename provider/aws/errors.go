package awsprovider

import (
	"errors"
	"fmt"

	"github.com/aws/smithy-go"

	"github.com/vpcip/vpcip/provider"
)

// classify wraps an EC2 error with the provider sentinel its error code
// stands for, so callers use errors.Is. It is the only place that knows EC2
// error codes. Errors without an API error code (transport failures,
// cancelled contexts) and codes without a sentinel are returned wrapped with
// the action name only.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return fmt.Errorf("EC2 %s: %w", op, err)
	}
	var sentinel error
	switch apiErr.ErrorCode() {
	case "RequestLimitExceeded", "Throttling", "ThrottlingException":
		sentinel = provider.ErrThrottled
	case "PrivateIpAddressLimitExceeded":
		sentinel = provider.ErrAddressLimit
	case "AttachmentLimitExceeded":
		sentinel = provider.ErrENILimit
	case "InsufficientFreeAddressesInSubnet":
		sentinel = provider.ErrSubnetFull
	case "InsufficientCidrBlocks":
		sentinel = provider.ErrInsufficientCIDR
	case "InvalidNetworkInterfaceID.NotFound", "InvalidNetworkInterfaceId.NotFound",
		"InvalidInstanceID.NotFound", "InvalidSubnetID.NotFound",
		"InvalidAttachmentID.NotFound", "InvalidInstanceType", "InvalidGroup.NotFound":
		sentinel = provider.ErrNotFound
	case "UnauthorizedOperation", "AuthFailure":
		sentinel = provider.ErrUnauthorized
	case "InvalidIPAddress.InUse":
		sentinel = provider.ErrAddressInUse
	default:
		return fmt.Errorf("EC2 %s: %w", op, err)
	}
	return fmt.Errorf("EC2 %s: %w: %w", op, sentinel, err)
}

// outcome names an error for provider.CallObserver: "ok", the sentinel's
// short name, or "error".
func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, provider.ErrThrottled):
		return "throttled"
	case errors.Is(err, provider.ErrAddressLimit):
		return "address_limit"
	case errors.Is(err, provider.ErrENILimit):
		return "eni_limit"
	case errors.Is(err, provider.ErrSubnetFull):
		return "subnet_full"
	case errors.Is(err, provider.ErrInsufficientCIDR):
		return "insufficient_cidr"
	case errors.Is(err, provider.ErrNotFound):
		return "not_found"
	case errors.Is(err, provider.ErrUnauthorized):
		return "unauthorized"
	case errors.Is(err, provider.ErrAddressInUse):
		return "address_in_use"
	default:
		return "error"
	}
}
