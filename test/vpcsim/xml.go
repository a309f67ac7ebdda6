package vpcsim

import (
	"bytes"
	"compress/gzip"
	"encoding/xml"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ec2Namespace is the XML namespace of EC2 API version 2016-11-15 replies.
const ec2Namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"

// apiVersion is the only EC2 API version the simulator speaks.
const apiVersion = "2016-11-15"

// reply is the body of a successful EC2 answer; every reply type embeds meta.
type reply interface{ setRequestID(string) }

type meta struct {
	RequestID string `xml:"requestId"`
}

func (m *meta) setRequestID(id string) { m.RequestID = id }

// returnReply is the answer of actions that only confirm: <return>true</return>.
type returnReply struct {
	meta
	Return bool `xml:"return"`
}

// writeReply writes <ActionResponse xmlns=...><requestId>..</requestId>...</ActionResponse>.
func writeReply(w http.ResponseWriter, req *http.Request, action, requestID string, r reply) {
	r.setRequestID(requestID)
	var buf bytes.Buffer
	buf.WriteString(xml.Header)
	enc := xml.NewEncoder(&buf)
	start := xml.StartElement{
		Name: xml.Name{Local: action + "Response"},
		Attr: []xml.Attr{{Name: xml.Name{Local: "xmlns"}, Value: ec2Namespace}},
	}
	if err := enc.EncodeElement(r, start); err != nil {
		writeError(w, req, requestID, errorf("InternalError", "An internal error has occurred: %v", err))
		return
	}
	writeBody(w, req, http.StatusOK, buf.Bytes())
}

// gzipMinBytes is the reply size from which replies are gzipped for
// clients that accept it.
const gzipMinBytes = 1024

// writeBody writes an XML reply with its Content-Length, gzipped when the
// client accepts gzip and the reply is large. Besides saving bytes, a
// compressed reply usually reaches the client in one segment: aws-sdk-go-v2
// closes the request body as soon as the response headers arrive, which can
// make Go's transport drop the connection while a long reply body is still
// being read (the SDK's request-body WriteTo answers io.EOF once closed; see
// aws/aws-sdk-go-v2 issues 1825 and 2737); a reply the client has already
// buffered whole, within its 4 KiB read buffer, survives that.
func writeBody(w http.ResponseWriter, r *http.Request, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "text/xml;charset=UTF-8")
	if len(body) >= gzipMinBytes && acceptsGzip(r) {
		var z bytes.Buffer
		zw := gzipWriters.Get().(*gzip.Writer)
		zw.Reset(&z)
		zw.Write(body)
		if zw.Close() == nil {
			h.Set("Content-Encoding", "gzip")
			body = z.Bytes()
		}
		gzipWriters.Put(zw)
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

// gzipWriters recycles gzip writers: each holds about a megabyte of state.
var gzipWriters = sync.Pool{New: func() any {
	zw, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	return zw
}}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		name, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(name), "gzip") && strings.ReplaceAll(q, " ", "") != "q=0" {
			return true
		}
	}
	return false
}

// errorResponse is EC2's error shape:
// <Response><Errors><Error><Code/><Message/></Error></Errors><RequestID/></Response>.
type errorResponse struct {
	XMLName   xml.Name   `xml:"Response"`
	Errors    []xmlError `xml:"Errors>Error"`
	RequestID string     `xml:"RequestID"`
}

type xmlError struct {
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}

func writeError(w http.ResponseWriter, r *http.Request, requestID string, e *Error) {
	body, _ := xml.Marshal(errorResponse{Errors: []xmlError{{Code: e.Code, Message: e.Message}}, RequestID: requestID})
	writeBody(w, r, e.HTTPStatus(), append([]byte(xml.Header), body...))
}

func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

type xmlTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

func tagSet(m map[string]string) []xmlTag {
	out := make([]xmlTag, 0, len(m))
	for k, v := range m {
		out = append(out, xmlTag{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

type xmlGroup struct {
	GroupID   string `xml:"groupId"`
	GroupName string `xml:"groupName"`
}

type xmlPrivateIP struct {
	PrivateIPAddress string `xml:"privateIpAddress"`
	Primary          bool   `xml:"primary"`
}

type xmlPrefix struct {
	Ipv4Prefix string `xml:"ipv4Prefix"`
}

type xmlAttachment struct {
	AttachmentID        string `xml:"attachmentId"`
	InstanceID          string `xml:"instanceId,omitempty"`
	InstanceOwnerID     string `xml:"instanceOwnerId,omitempty"`
	DeviceIndex         int    `xml:"deviceIndex"`
	NetworkCardIndex    int    `xml:"networkCardIndex"`
	Status              string `xml:"status"`
	AttachTime          string `xml:"attachTime"`
	DeleteOnTermination bool   `xml:"deleteOnTermination"`
}

// xmlENI is EC2's NetworkInterface (and, without the zone fields, an
// instance's InstanceNetworkInterface).
type xmlENI struct {
	NetworkInterfaceID string         `xml:"networkInterfaceId"`
	SubnetID           string         `xml:"subnetId"`
	VpcID              string         `xml:"vpcId"`
	AvailabilityZone   string         `xml:"availabilityZone,omitempty"`
	Description        string         `xml:"description"`
	OwnerID            string         `xml:"ownerId"`
	RequesterManaged   *bool          `xml:"requesterManaged,omitempty"`
	Status             string         `xml:"status"`
	MacAddress         string         `xml:"macAddress"`
	PrivateIPAddress   string         `xml:"privateIpAddress"`
	SourceDestCheck    bool           `xml:"sourceDestCheck"`
	InterfaceType      string         `xml:"interfaceType"`
	GroupSet           []xmlGroup     `xml:"groupSet>item"`
	Attachment         *xmlAttachment `xml:"attachment,omitempty"`
	TagSet             []xmlTag       `xml:"tagSet>item"`
	PrivateIPAddresses []xmlPrivateIP `xml:"privateIpAddressesSet>item"`
	Ipv4Prefixes       []xmlPrefix    `xml:"ipv4PrefixSet>item"`
	Ipv6Addresses      []xmlIPv6Addr  `xml:"ipv6AddressesSet>item"`
	Ipv6Prefixes       []xmlIPv6Pfx   `xml:"ipv6PrefixSet>item"`
}

type xmlIPv6Addr struct {
	Ipv6Address   string `xml:"ipv6Address"`
	IsPrimaryIpv6 bool   `xml:"isPrimaryIpv6"`
}

type xmlIPv6Pfx struct {
	Ipv6Prefix string `xml:"ipv6Prefix"`
}

func (c *Cloud) eniXMLLocked(e *eni, inInstance bool) xmlENI {
	s := c.subnets[e.subnetID]
	x := xmlENI{
		NetworkInterfaceID: e.id, SubnetID: e.subnetID, VpcID: c.vpc.id,
		Description: e.description, OwnerID: AccountID, Status: "available",
		MacAddress: e.mac, PrivateIPAddress: e.primary.String(),
		SourceDestCheck: true, InterfaceType: "interface",
	}
	if !inInstance {
		x.AvailabilityZone = s.az
		rm := e.requesterManaged
		x.RequesterManaged = &rm
		x.TagSet = tagSet(e.tags)
	}
	for _, g := range e.groups {
		x.GroupSet = append(x.GroupSet, xmlGroup{GroupID: g, GroupName: c.groups[g].name})
	}
	if e.inst != nil {
		x.Status = "in-use"
		x.Attachment = &xmlAttachment{
			AttachmentID: e.attachmentID, InstanceID: e.inst.id, InstanceOwnerID: AccountID,
			DeviceIndex: e.deviceIndex, NetworkCardIndex: e.networkCard, Status: e.attachStatus,
			AttachTime: timestamp(e.attachTime), DeleteOnTermination: e.deleteOnTerm,
		}
		if inInstance {
			x.Attachment.InstanceID, x.Attachment.InstanceOwnerID = "", ""
		}
	}
	x.PrivateIPAddresses = append(x.PrivateIPAddresses, xmlPrivateIP{e.primary.String(), true})
	for _, a := range e.secondaries {
		x.PrivateIPAddresses = append(x.PrivateIPAddresses, xmlPrivateIP{a.String(), false})
	}
	for _, p := range e.prefixes {
		x.Ipv4Prefixes = append(x.Ipv4Prefixes, xmlPrefix{p.String()})
	}
	for _, a := range e.ipv6 {
		x.Ipv6Addresses = append(x.Ipv6Addresses, xmlIPv6Addr{Ipv6Address: a.String()})
	}
	for _, p := range e.ipv6Prefixes {
		x.Ipv6Prefixes = append(x.Ipv6Prefixes, xmlIPv6Pfx{p.String()})
	}
	return x
}

type xmlInstanceState struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

func instanceState(name string) xmlInstanceState {
	codes := map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}
	return xmlInstanceState{Code: codes[name], Name: name}
}

type xmlPlacement struct {
	AvailabilityZone string `xml:"availabilityZone"`
	Tenancy          string `xml:"tenancy"`
}

type xmlInstance struct {
	InstanceID        string           `xml:"instanceId"`
	ImageID           string           `xml:"imageId"`
	InstanceState     xmlInstanceState `xml:"instanceState"`
	PrivateIPAddress  string           `xml:"privateIpAddress,omitempty"`
	InstanceType      string           `xml:"instanceType"`
	LaunchTime        string           `xml:"launchTime"`
	Placement         xmlPlacement     `xml:"placement"`
	SubnetID          string           `xml:"subnetId,omitempty"`
	VpcID             string           `xml:"vpcId,omitempty"`
	SourceDestCheck   bool             `xml:"sourceDestCheck"`
	GroupSet          []xmlGroup       `xml:"groupSet>item"`
	Architecture      string           `xml:"architecture"`
	Hypervisor        string           `xml:"hypervisor"`
	NetworkInterfaces []xmlENI         `xml:"networkInterfaceSet>item"`
	TagSet            []xmlTag         `xml:"tagSet>item"`
}

func (c *Cloud) instanceXMLLocked(inst *instance) xmlInstance {
	x := xmlInstance{
		InstanceID: inst.id, ImageID: "ami-0123456789abcdef0", InstanceState: instanceState(inst.state),
		InstanceType: inst.typ, LaunchTime: timestamp(inst.launched),
		Placement: xmlPlacement{AvailabilityZone: inst.az, Tenancy: "default"},
		// DescribeInstances reports "xen" for Nitro types too: its HypervisorType has no "nitro".
		SourceDestCheck: true, Architecture: "x86_64", Hypervisor: "xen", TagSet: tagSet(inst.tags),
	}
	if len(inst.itype.Architectures) > 0 {
		x.Architecture = inst.itype.Architectures[len(inst.itype.Architectures)-1]
	}
	if inst.state == "running" {
		x.SubnetID, x.VpcID = inst.subnetID, c.vpc.id
	}
	for _, e := range inst.enis {
		if e.deviceIndex == 0 && e.networkCard == inst.itype.DefaultNetworkCard {
			x.PrivateIPAddress = e.primary.String()
			for _, g := range e.groups {
				x.GroupSet = append(x.GroupSet, xmlGroup{GroupID: g, GroupName: c.groups[g].name})
			}
		}
		x.NetworkInterfaces = append(x.NetworkInterfaces, c.eniXMLLocked(e, true))
	}
	return x
}

type xmlNetworkCard struct {
	NetworkCardIndex         int `xml:"networkCardIndex"`
	MaximumNetworkInterfaces int `xml:"maximumNetworkInterfaces"`
}

type xmlNetworkInfo struct {
	MaximumNetworkInterfaces  int              `xml:"maximumNetworkInterfaces"`
	MaximumNetworkCards       int              `xml:"maximumNetworkCards"`
	DefaultNetworkCardIndex   int              `xml:"defaultNetworkCardIndex"`
	NetworkCards              []xmlNetworkCard `xml:"networkCards>item"`
	Ipv4AddressesPerInterface int              `xml:"ipv4AddressesPerInterface"`
	Ipv6AddressesPerInterface int              `xml:"ipv6AddressesPerInterface"`
	Ipv6Supported             bool             `xml:"ipv6Supported"`
	EnaSupport                string           `xml:"enaSupport"`
}

type xmlInstanceType struct {
	InstanceType  string         `xml:"instanceType"`
	BareMetal     bool           `xml:"bareMetal"`
	Hypervisor    string         `xml:"hypervisor,omitempty"`
	Architectures []string       `xml:"processorInfo>supportedArchitectures>item"`
	NetworkInfo   xmlNetworkInfo `xml:"networkInfo"`
}

func instanceTypeXML(t InstanceType) xmlInstanceType {
	x := xmlInstanceType{
		InstanceType: t.Name, BareMetal: t.BareMetal, Hypervisor: t.Hypervisor,
		Architectures: slices.Clone(t.Architectures),
		NetworkInfo: xmlNetworkInfo{
			MaximumNetworkInterfaces: t.MaxENIs, MaximumNetworkCards: t.MaxNetworkCards,
			DefaultNetworkCardIndex: t.DefaultNetworkCard, Ipv4AddressesPerInterface: t.IPv4PerENI,
			Ipv6AddressesPerInterface: t.IPv6PerENI, Ipv6Supported: t.IPv6Supported, EnaSupport: "required",
		},
	}
	for i, n := range t.CardENIs {
		x.NetworkInfo.NetworkCards = append(x.NetworkInfo.NetworkCards, xmlNetworkCard{i, n})
	}
	return x
}
