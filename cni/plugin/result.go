package plugin

import (
	"bytes"
	"encoding/json"
	"net"
	"strconv"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// appendResult appends r as JSON, byte for byte what r.PrintTo writes
// (libcni 1.x: every object's keys sorted, as its marshal through a map
// leaves them, indented by four spaces), without building encoding/json's
// reflection encoders for the result's types: PrintTo costs ~0.5M
// instructions in a process that prints one result, this a few thousand.
// TestAppendResultIsPrintTo holds the two equal.
func appendResult(b []byte, r *current.Result) ([]byte, error) {
	var c []byte
	c = append(c, '{')
	sep := func() {
		if c[len(c)-1] != '{' {
			c = append(c, ',')
		}
	}
	if r.CNIVersion != "" {
		c = appendKey(c, "cniVersion")
		c = appendString(c, r.CNIVersion)
	}
	if !r.DNS.IsEmpty() {
		sep()
		c = appendKey(c, "dns")
		c = appendDNS(c, &r.DNS)
	}
	if len(r.Interfaces) > 0 {
		sep()
		c = appendKey(c, "interfaces")
		c = appendList(c, r.Interfaces, appendInterface)
	}
	if len(r.IPs) > 0 {
		sep()
		c = appendKey(c, "ips")
		c = appendList(c, r.IPs, appendIPConfig)
	}
	if len(r.Routes) > 0 {
		sep()
		c = appendKey(c, "routes")
		c = appendList(c, r.Routes, appendRoute)
	}
	c = append(c, '}')
	return indent(b, c)
}

// indent is json.MarshalIndent's layout of the compact JSON c.
func indent(b, c []byte) ([]byte, error) {
	out := bytes.NewBuffer(b)
	if err := json.Indent(out, c, "", "    "); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// appendList appends a JSON array of xs, null for a nil element.
func appendList[T any](b []byte, xs []*T, elem func([]byte, *T) []byte) []byte {
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		if x == nil {
			b = append(b, "null"...)
			continue
		}
		b = elem(b, x)
	}
	return append(b, ']')
}

// object appends JSON objects' members, sorted by the caller.
type object struct{ b []byte }

func (o *object) key(k string) {
	if o.b[len(o.b)-1] != '{' {
		o.b = append(o.b, ',')
	}
	o.b = appendKey(o.b, k)
}

func (o *object) str(k, v string) {
	if v != "" {
		o.key(k)
		o.b = appendString(o.b, v)
	}
}

func (o *object) num(k string, v int) {
	if v != 0 {
		o.key(k)
		o.b = strconv.AppendInt(o.b, int64(v), 10)
	}
}

func (o *object) ptr(k string, v *int) {
	if v != nil {
		o.key(k)
		o.b = strconv.AppendInt(o.b, int64(*v), 10)
	}
}

func (o *object) ip(k string, v net.IP) {
	if len(v) > 0 {
		o.key(k)
		o.b = appendString(o.b, v.String())
	}
}

func (o *object) list(k string, v []string) {
	if len(v) == 0 {
		return
	}
	o.key(k)
	o.b = append(o.b, '[')
	for i, s := range v {
		if i > 0 {
			o.b = append(o.b, ',')
		}
		o.b = appendString(o.b, s)
	}
	o.b = append(o.b, ']')
}

func appendDNS(b []byte, d *types.DNS) []byte {
	o := object{append(b, '{')}
	o.str("domain", d.Domain)
	o.list("nameservers", d.Nameservers)
	o.list("options", d.Options)
	o.list("search", d.Search)
	return append(o.b, '}')
}

func appendInterface(b []byte, i *current.Interface) []byte {
	o := object{append(b, '{')}
	o.str("mac", i.Mac)
	o.num("mtu", i.Mtu)
	o.key("name")
	o.b = appendString(o.b, i.Name)
	o.str("pciID", i.PciID)
	o.str("sandbox", i.Sandbox)
	o.str("socketPath", i.SocketPath)
	return append(o.b, '}')
}

func appendIPConfig(b []byte, ip *current.IPConfig) []byte {
	o := object{append(b, '{')}
	o.key("address")
	o.b = appendString(o.b, ip.Address.String())
	o.ip("gateway", ip.Gateway)
	o.ptr("interface", ip.Interface)
	return append(o.b, '}')
}

func appendRoute(b []byte, r *types.Route) []byte {
	o := object{append(b, '{')}
	o.num("advmss", r.AdvMSS)
	o.key("dst")
	o.b = appendString(o.b, r.Dst.String())
	o.ip("gw", r.GW)
	o.num("mtu", r.MTU)
	o.num("priority", r.Priority)
	o.ptr("scope", r.Scope)
	o.ptr("table", r.Table)
	return append(o.b, '}')
}

func appendKey(b []byte, k string) []byte {
	return append(appendString(b, k), ':')
}

// appendString appends s as encoding/json writes a string (HTML-safe
// escapes, invalid UTF-8 replaced).
func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string never fails
	return append(b, q...)
}
