// Package awsprovider implements provider.Provider on Amazon EC2 and the
// instance metadata service (IMDSv2) through aws-sdk-go-v2.
//
// # Configuration
//
// Endpoints, region and credentials come only from the SDK's standard
// configuration (config.LoadDefaultConfig): AWS_REGION, AWS_ENDPOINT_URL_EC2,
// AWS_EC2_METADATA_SERVICE_ENDPOINT, the shared config files and the usual
// credential chain. Nothing here knows about a particular endpoint, so any
// EC2-compatible API and IMDSv2-shaped metadata server can stand in for AWS.
//
// # Throttling
//
// EC2 meters API calls per account and region with token buckets, separately
// for mutating actions and for describe actions, and refuses calls beyond the
// bucket with RequestLimitExceeded. Every node of a cluster draws on the same
// buckets, so a node must hold its own rate down rather than discover the
// limit by being refused. The client therefore paces every attempt (retries
// included) through two golang.org/x/time/rate limiters, one for mutating
// and one for describe actions, each with a configured rate (calls per
// second) and burst. A call EC2 still refuses for rate is retried after an
// exponential backoff with equal jitter (never sooner than half the base
// delay, so nodes refused together do not retry in lock-step) until it is
// served or its context or Options.MaxThrottleWait ends; throttling alone
// does not fail a call before that.
//
// The SDK's own retryer is switched off for EC2 (aws.NopRetryer). Its
// adaptive mode was not chosen because it keeps one limiter for all actions,
// starts unlimited and slows down only after EC2 has refused calls — the
// burst after a fleet-wide restart is exactly the storm to avoid — and both
// SDK modes draw retries from a client-wide retry quota that, once spent under
// sustained throttling, fails calls outright.
//
// Transient failures other than throttling (HTTP 5xx, broken connections) are
// retried up to Options.MaxAttempts only for actions that are safe to repeat:
// describes, deletes, detaches, attribute changes, unassigns, and
// CreateNetworkInterface, which carries an idempotency token (ClientToken).
// AssignPrivateIpAddresses and AttachNetworkInterface are not repeated after
// a transient failure, since a lost reply may hide a change that was made.
//
// # Errors
//
// EC2 error codes are mapped to the sentinel errors of package provider in
// one function (classify); the returned error wraps both the sentinel and
// the SDK's smithy.APIError, so errors.Is and errors.As both work and the
// message keeps EC2's code and text.
//
// # Instance metadata and consistency
//
// IMDS is cheap and not metered, but it lags behind the EC2 API. After an
// attach or an assign the client waits, with backoff and at most
// Options.MetadataWait, until IMDS shows the change, so the daemon never
// hands out an address the node cannot see yet. Where IMDS and EC2 disagree,
// EC2 wins: MetadataENIs keeps reporting an address EC2 has confirmed and
// IMDS has shown once, even while IMDS omits it, and stops reporting one this
// client has unassigned through EC2 even while IMDS still lists it. An
// address is never reported as gone on IMDS's word alone.
//
// # Tags
//
// Every ENI this client creates carries TagInstanceID, TagCluster, TagNode
// and TagCreatedAt, so that DeleteLeakedENIs on any node of the cluster can
// find ENIs whose owner died between detach and delete.
package awsprovider

//go:generate go run ./internal/limitsgen -in ../../test/vpcsim/ec2-instance-network-limits.csv -out limits_table.go
