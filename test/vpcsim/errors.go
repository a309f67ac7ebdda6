package vpcsim

import (
	"fmt"
	"net/http"
)

// Error is an EC2 API error: a code from EC2's error-code list and a message.
// The EC2 handler answers it in EC2's error shape with HTTPStatus; the Go API
// (LaunchInstance, TerminateInstance) returns it as is.
type Error struct {
	Code    string // e.g. "InvalidNetworkInterfaceID.NotFound"
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// HTTPStatus is the status EC2 answers the code with: 503 for throttling and
// unavailability, 500 for internal errors, 403 for authorization, 401 for
// authentication, 412 for a successful dry run, 400 for every other client
// error.
func (e *Error) HTTPStatus() int { return statusOf(e.Code) }

func statusOf(code string) int {
	switch code {
	case "RequestLimitExceeded", "Unavailable", "ServiceUnavailable":
		return http.StatusServiceUnavailable
	case "InternalError", "InternalFailure":
		return http.StatusInternalServerError
	case "UnauthorizedOperation", "Blocked", "OptInRequired":
		return http.StatusForbidden
	case "AuthFailure", "MissingAuthenticationToken":
		return http.StatusUnauthorized
	case "DryRunOperation":
		return http.StatusPreconditionFailed
	}
	return http.StatusBadRequest
}

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func errENINotFound(id string) *Error {
	return errorf("InvalidNetworkInterfaceID.NotFound", "The networkInterface ID '%s' does not exist", id)
}

func errInstanceNotFound(id string) *Error {
	return errorf("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
}

func errMissing(param string) *Error {
	return errorf("MissingParameter", "The request must contain the parameter %s", param)
}

func errBadValue(param, value, why string) *Error {
	return errorf("InvalidParameterValue", "Value (%s) for parameter %s is invalid. %s", value, param, why)
}
