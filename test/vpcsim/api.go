package vpcsim

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
)

// maxRequestBytes bounds an EC2 Query request body.
const maxRequestBytes = 1 << 20

// action handles one EC2 action. It runs with the model lock held.
type action func(c *Cloud, p params) (reply, *Error)

// actions are the EC2 actions the simulator answers.
var actions = map[string]action{
	"DescribeInstances":               (*Cloud).describeInstancesLocked,
	"DescribeInstanceTypes":           (*Cloud).describeInstanceTypesLocked,
	"DescribeSubnets":                 (*Cloud).describeSubnetsLocked,
	"DescribeSecurityGroups":          (*Cloud).describeSecurityGroupsLocked,
	"DescribeNetworkInterfaces":       (*Cloud).describeENIsLocked,
	"CreateNetworkInterface":          (*Cloud).createENIActionLocked,
	"AttachNetworkInterface":          (*Cloud).attachActionLocked,
	"DetachNetworkInterface":          (*Cloud).detachActionLocked,
	"DeleteNetworkInterface":          (*Cloud).deleteENIActionLocked,
	"ModifyNetworkInterfaceAttribute": (*Cloud).modifyENIActionLocked,
	"AssignPrivateIpAddresses":        (*Cloud).assignActionLocked,
	"UnassignPrivateIpAddresses":      (*Cloud).unassignActionLocked,
	"AssignIpv6Addresses":             (*Cloud).assignIPv6ActionLocked,
	"UnassignIpv6Addresses":           (*Cloud).unassignIPv6ActionLocked,
	"CreateTags":                      (*Cloud).createTagsLocked,
	"DeleteTags":                      (*Cloud).deleteTagsLocked,
	"TerminateInstances":              (*Cloud).terminateActionLocked,
}

// EC2Handler serves EC2's Query API, version 2016-11-15: form-encoded POST
// (or GET) requests with Action=...&Version=2016-11-15, answered with EC2's
// XML replies, or EC2's error shape and HTTP status. Until SetIAM, requests
// are not authenticated: any signature or none is accepted; after, see IAM.
// It also answers STS's AssumeRoleWithWebIdentity (see serveSTS).
func (c *Cloud) EC2Handler() http.Handler { return http.HandlerFunc(c.serveEC2) }

func (c *Cloud) serveEC2(w http.ResponseWriter, r *http.Request) {
	requestID := c.newRequestID()
	defer func() {
		if v := recover(); v != nil {
			writeError(w, r, requestID, errorf("InternalError", "An internal error has occurred: %v", v))
		}
	}()
	if r.Method != http.MethodPost && r.Method != http.MethodGet {
		writeError(w, r, requestID, errorf("InvalidHttpRequest", "The HTTP method %s is not supported.", r.Method))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBytes)
	body, rerr := readBody(r)
	if rerr == nil {
		rerr = r.ParseForm()
	}
	if rerr != nil {
		writeError(w, r, requestID, errorf("MalformedQueryString", "The request could not be parsed: %v", rerr))
		return
	}
	if isSTS(r.Form) {
		c.serveSTS(w, r, requestID)
		return
	}
	name, act, p, err := parseRequest(r.Form)
	if err == nil {
		err = c.checkEC2Auth(r, body, name)
	}
	if err != nil {
		writeError(w, r, requestID, err)
		return
	}
	if err := c.faults.before(r.Context(), name, bucketKey(name, p), callerAddr(r)); err != nil {
		writeError(w, r, requestID, err)
		return
	}
	res, err := c.run(name, act, p)
	if err != nil {
		writeError(w, r, requestID, err)
		return
	}
	writeReply(w, r, name, requestID, res)
}

// parseRequest checks the Action and Version of a request and returns the
// action to run.
func parseRequest(form url.Values) (string, action, params, *Error) {
	p := params(form)
	name := p.get("Action")
	if name == "" {
		return "", nil, nil, errorf("MissingAction", "The request must contain the parameter Action.")
	}
	act, ok := actions[name]
	if !ok {
		return "", nil, nil, errorf("InvalidAction", "The action %s is not valid for this web service.", name)
	}
	switch v := p.get("Version"); v {
	case apiVersion:
	case "":
		return "", nil, nil, errMissing("Version")
	default:
		return "", nil, nil, errorf("NoSuchVersion", "The requested version (%s) of service AmazonEC2 does not exist.", v)
	}
	dry, err := p.boolParam("DryRun", false)
	if err != nil {
		return "", nil, nil, err
	}
	if dry {
		return name, dryRun, p, nil
	}
	return name, act, p, nil
}

func dryRun(*Cloud, params) (reply, *Error) {
	return nil, errorf("DryRunOperation", "Request would have succeeded, but DryRun flag is set.")
}

func (c *Cloud) run(name string, act action, p params) (reply, *Error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	res, err := act(c, p)
	if err == nil && isMutating(name) {
		c.recordENIsLocked()
	}
	return res, err
}

func (c *Cloud) newRequestID() string {
	c.mu.Lock()
	a, b := c.tokenRnd.Uint64(), c.tokenRnd.Uint64()
	c.mu.Unlock()
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", uint32(a>>32), uint16(a>>16), uint16(a)&0xfff, uint16(b>>48)&0xfff, b&0xffffffffffff)
}

// callerAddr is the IP address a request came from (in the netns fabric, the
// calling instance's primary address), or RemoteAddr as is when it has no port.
func callerAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
