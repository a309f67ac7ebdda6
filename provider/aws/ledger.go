package awsprovider

import (
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// metadataLedger reconciles IMDS's lagging view with what EC2 has told this
// client, so that MetadataENIs never reports an address as gone on IMDS's
// word alone and never reports what EC2 says is gone.
//
// The rule: an address or ENI is reported once IMDS has shown it, and stays
// reported until EC2 says it is gone (this client's unassign or delete, or an
// ENIs listing without it). What EC2 says is gone is hidden for as long as
// IMDS still lists it.
type metadataLedger struct {
	mu   sync.Mutex            // guards the fields below
	enis map[string]*ledgerENI // ENI id → what was last reported
	gone map[string]bool       // ENI ids EC2 says are no longer attached, hidden while IMDS lists them
}

type ledgerENI struct {
	eni    provider.ENI               // attributes as IMDS last showed them
	since  time.Time                  // when IMDS first showed the ENI
	shown  map[netip.Prefix]time.Time // reported addresses (/32) and prefixes (/28) → when first shown
	hidden map[netip.Prefix]bool      // unassigned per EC2, hidden while IMDS lists them
}

func (l *metadataLedger) init() {
	l.enis = map[string]*ledgerENI{}
	l.gone = map[string]bool{}
}

// mac returns the MAC of an ENI IMDS has shown.
func (l *metadataLedger) mac(eniID string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.enis[eniID]; ok {
		return e.eni.MAC, true
	}
	return "", false
}

// merge folds IMDS's current list into the ledger and returns the report,
// sorted by device number.
func (l *metadataLedger) merge(imdsENIs []provider.ENI, now time.Time) []provider.ENI {
	l.mu.Lock()
	defer l.mu.Unlock()
	listed := map[string]bool{}
	for _, eni := range imdsENIs {
		listed[eni.ID] = true
		if l.gone[eni.ID] {
			continue
		}
		l.showLocked(eni, now)
	}
	for id := range l.gone {
		if !listed[id] { // IMDS caught up with EC2
			delete(l.gone, id)
		}
	}
	out := make([]provider.ENI, 0, len(l.enis))
	for _, e := range l.enis {
		out = append(out, e.report())
	}
	slices.SortFunc(out, func(a, b provider.ENI) int { return a.DeviceNumber - b.DeviceNumber })
	return out
}

// showLocked records eni as IMDS shows it now.
func (l *metadataLedger) showLocked(eni provider.ENI, now time.Time) {
	e := l.enis[eni.ID]
	if e == nil {
		e = &ledgerENI{since: now, shown: map[netip.Prefix]time.Time{}, hidden: map[netip.Prefix]bool{}}
		l.enis[eni.ID] = e
	}
	e.eni = eni
	listed := addressSet(eni)
	for p := range listed {
		if _, ok := e.shown[p]; !ok && !e.hidden[p] {
			e.shown[p] = now
		}
	}
	for p := range e.hidden {
		if !listed[p] {
			delete(e.hidden, p)
		}
	}
}

// report is the ENI with every shown address.
func (e *ledgerENI) report() provider.ENI {
	eni := e.eni
	eni.SecondaryIPs, eni.Prefixes = nil, nil
	for _, p := range slices.SortedFunc(maps.Keys(e.shown), comparePrefix) {
		if p.Bits() == 32 {
			eni.SecondaryIPs = append(eni.SecondaryIPs, p.Addr())
		} else {
			eni.Prefixes = append(eni.Prefixes, p)
		}
	}
	return eni
}

// visible records that IMDS showed eni (after a create or an assign waited
// for it).
func (l *metadataLedger) visible(eni provider.ENI, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.gone, eni.ID)
	l.showLocked(eni, now)
}

// showAddrs records that IMDS lists these addresses (/32, the primary
// included) and prefixes on a known ENI; it reports false when the ledger
// does not know the ENI.
func (l *metadataLedger) showAddrs(eniID string, listed map[netip.Prefix]bool, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.enis[eniID]
	if e == nil {
		return false
	}
	for p := range listed {
		if _, ok := e.shown[p]; !ok && !e.hidden[p] && p.Addr() != e.eni.PrimaryIP {
			e.shown[p] = now
		}
	}
	return true
}

// assigned records EC2's word that ps are on eniID: if they were unassigned
// earlier, IMDS listing them again no longer means stale data.
func (l *metadataLedger) assigned(eniID string, ps []netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.enis[eniID]; e != nil {
		for _, p := range ps {
			delete(e.hidden, p)
		}
	}
}

// unassigned records EC2's word that ps are no longer on eniID.
func (l *metadataLedger) unassigned(eniID string, ps []netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.enis[eniID]
	if e == nil {
		return
	}
	for _, p := range ps {
		delete(e.shown, p)
		e.hidden[p] = true
	}
}

// detached records EC2's word that eniID is no longer attached here.
func (l *metadataLedger) detached(eniID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.enis, eniID)
	l.gone[eniID] = true
}

// snapshot folds an authoritative EC2 listing of the instance's ENIs, taken
// starting at asOf: ENIs and addresses shown before asOf that EC2 does not
// list are gone. Addresses shown later may postdate the listing and stay.
func (l *metadataLedger) snapshot(ec2ENIs []provider.ENI, asOf time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	byID := make(map[string]provider.ENI, len(ec2ENIs))
	for _, eni := range ec2ENIs {
		byID[eni.ID] = eni
	}
	for id, e := range l.enis {
		ec2ENI, ok := byID[id]
		if !ok {
			if e.since.Before(asOf) {
				delete(l.enis, id)
				l.gone[id] = true
			}
			continue
		}
		have := addressSet(ec2ENI)
		for p, at := range e.shown {
			if !have[p] && at.Before(asOf) {
				delete(e.shown, p)
				e.hidden[p] = true
			}
		}
		for p := range have {
			delete(e.hidden, p)
		}
	}
}
