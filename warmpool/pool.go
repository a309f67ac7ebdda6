package warmpool

// pool is the node's address accounting, in addresses except freePrefixes.
type pool struct {
	slots        int // slots held: /32s and /28s
	total        int // addresses held: sum of slot sizes
	assigned     int // addresses held by pods
	cooling      int // addresses in cooldown: counted in total, not available
	available    int // addresses a pod could get now
	freePrefixes int // /28 prefixes with all 16 addresses available
}

// add adds (sign 1) or removes (sign −1) one slot's addresses.
func (p *pool) add(s *Slot, sign int) {
	size := s.Size()
	if size == 0 {
		return
	}
	a, c := max(s.Assigned, 0), max(s.Cooling, 0)
	free := max(size-a-c, 0)
	p.slots += sign
	p.total += sign * size
	p.assigned += sign * a
	p.cooling += sign * c
	p.available += sign * free
	if free == PrefixAddresses {
		p.freePrefixes += sign
	}
}

// plus is the pool with (sign 1) or without (sign −1) the addresses of q,
// typically one ENI's pool.
func (p pool) plus(q pool, sign int) pool {
	return pool{
		slots:        p.slots + sign*q.slots,
		total:        p.total + sign*q.total,
		assigned:     p.assigned + sign*q.assigned,
		cooling:      p.cooling + sign*q.cooling,
		available:    p.available + sign*q.available,
		freePrefixes: p.freePrefixes + sign*q.freePrefixes,
	}
}

func poolOfENI(e *ENI) pool {
	var p pool
	for i := range e.Slots {
		p.add(&e.Slots[i], 1)
	}
	return p
}

func poolOf(enis []ENI) pool {
	var p pool
	for i := range enis {
		p = p.plus(poolOfENI(&enis[i]), 1)
	}
	return p
}

// policy is which configuration variable sizes the pool.
type policy int

const (
	byIPTargets    policy = iota // WARM_IP_TARGET / MINIMUM_IP_TARGET
	byPrefixTarget               // WARM_PREFIX_TARGET (prefix mode)
	byENITarget                  // WARM_ENI_TARGET
	byDemand                     // Config.Adaptive, no warm variable set
)

// target is the pool's goal, resolved from Config with its defaults.
type target struct {
	policy       policy
	warmIP       int          // addresses (byIPTargets)
	minIP        int          // addresses (byIPTargets)
	warmPrefixes int          // whole free /28 prefixes (byPrefixTarget)
	warmENIs     int          // ENIs (byENITarget)
	warmAddrs    int          // addresses: WARM_ENI_TARGET × SlotsPerENI (byENITarget)
	pending      int          // addresses for pods waiting now
	demand       demandTarget // byDemand
}

// prefixMode reports whether the node is configured for prefix delegation
// and its instance type supports it.
func prefixMode(in Input) bool {
	return in.Config.PrefixDelegation && in.Limits.PrefixSupported
}

// inUse is what the adaptive policy counts as taken: assigned and cooling
// addresses.
func inUse(p pool) int { return p.assigned + p.cooling }

func targetOf(in Input) target {
	c := in.Config
	t := target{pending: max(in.Pending, in.Demand.Unaddressed, 0)}
	switch {
	case c.WarmIPTarget > 0 || c.MinimumIPTarget > 0:
		t.policy = byIPTargets
		t.warmIP = max(c.WarmIPTarget, 0)
		t.minIP = max(c.MinimumIPTarget, 0)
	case c.Adaptive && c.WarmENITarget <= 0 && c.WarmPrefixTarget <= 0:
		t.policy = byDemand
		t.demand = demandOf(in, roomSlots(in), prefixMode(in), inUse(poolOf(in.ENIs)))
	case prefixMode(in):
		t.policy = byPrefixTarget
		t.warmPrefixes = c.WarmPrefixTarget
		if t.warmPrefixes <= 0 {
			t.warmPrefixes = DefaultWarmPrefixTarget
		}
	default:
		t.policy = byENITarget
		n := c.WarmENITarget
		if n <= 0 {
			n = DefaultWarmENITarget
		}
		t.warmENIs = n
		t.warmAddrs = n * max(in.Limits.SlotsPerENI, 0)
	}
	return t
}

// short is how many addresses the pool lacks, at least 0. wholePrefixes
// says whether WARM_PREFIX_TARGET is counted in whole free /28s (prefix
// growth possible) or only in addresses (falling back to single addresses).
func (t target) short(p pool, wholePrefixes bool) int {
	switch t.policy {
	case byIPTargets:
		return max(t.warmIP+t.pending-p.available, t.minIP-p.total, 0)
	case byPrefixTarget:
		byAddrs := t.pending + t.warmPrefixes*PrefixAddresses - p.available
		if !wholePrefixes {
			return max(byAddrs, 0)
		}
		return max((t.warmPrefixes-p.freePrefixes)*PrefixAddresses, byAddrs, 0)
	case byDemand:
		return max(t.demand.low-p.available, 0)
	default:
		return max(t.warmAddrs+t.pending-p.available, 0)
	}
}

// surplus is how many addresses the pool holds beyond its target, at least
// 0, before slot granularity: under IP targets exactly what may be given
// back; under the prefix and ENI targets an upper bound (whole free
// prefixes, whole ENIs).
func (t target) surplus(p pool) int {
	switch t.policy {
	case byIPTargets:
		return max(min(p.available-t.warmIP-t.pending, p.total-t.minIP), 0)
	case byPrefixTarget:
		return max(p.available-t.pending-t.warmPrefixes*PrefixAddresses, 0)
	case byDemand:
		return max(p.available+p.cooling-t.demand.keep, 0)
	default:
		return max(p.available-t.warmAddrs-t.pending, 0)
	}
}

func (t target) describe() string {
	switch t.policy {
	case byIPTargets:
		return "WARM_IP_TARGET " + itoa(t.warmIP) + ", MINIMUM_IP_TARGET " + itoa(t.minIP)
	case byPrefixTarget:
		return "WARM_PREFIX_TARGET " + itoa(t.warmPrefixes)
	case byDemand:
		return t.demand.describe()
	default:
		return "WARM_ENI_TARGET " + itoa(t.warmENIs) + " = " + count(t.warmAddrs, "address")
	}
}

// Counts is a node's pool in numbers, in the same accounting as Next. All
// counts are addresses unless named otherwise. vpcipd's status, metrics and
// `vpcipctl capacity` count capacity with the same ENICapacity and Budget.
type Counts struct {
	ENIs         int // ENIs attached
	MaxENIs      int // Limits.MaxENIs
	Slots        int // slots held: secondary /32 addresses plus /28 prefixes
	Prefixes     int // /28 prefixes held
	FreePrefixes int // /28 prefixes whose 16 addresses are all available
	Total        int // addresses held on the node's ENIs: Assigned + Cooling + Available
	Assigned     int // addresses held by pods
	Cooling      int // addresses released by pods less than IP_COOLDOWN_PERIOD ago: not available yet
	Available    int // addresses a pod could get now (the warm pool)
	Capacity     int // addresses the attached ENIs could hold (ENICapacity, summed)
	Budget       int // addresses the node could hold at its ENI limit (Budget)
	MaxPods      int // Limits.MaxPods; 0: no limit beyond ENIs
	Short        int // addresses below the configured target (what Next would grow by, before slot rounding and limits)
	Surplus      int // addresses beyond the configured target (an upper bound on what Next may give back)
}

// Summarize counts the pool of in: totals over every ENI and slot, the
// node's address capacity and the distance to the configured target, with
// the same accounting Next uses (cooling addresses are in Total, not in
// Available). It does no I/O and never fails; invalid slots count as empty.
func Summarize(in Input) Counts {
	p := poolOf(in.ENIs)
	t := targetOf(in)
	unit := 1
	if prefixMode(in) {
		unit = PrefixAddresses
	}
	prefixes, capacity := 0, 0
	for _, e := range in.ENIs {
		held := 0
		for _, s := range e.Slots {
			if s.Size() == PrefixAddresses {
				prefixes++
			}
			held += s.Size()
		}
		capacity += ENICapacity(held, len(e.Slots), in.Limits, unit)
	}
	return Counts{
		ENIs:         len(in.ENIs),
		MaxENIs:      in.Limits.MaxENIs,
		Slots:        p.slots,
		Prefixes:     prefixes,
		FreePrefixes: p.freePrefixes,
		Total:        p.total,
		Assigned:     p.assigned,
		Cooling:      p.cooling,
		Available:    p.available,
		Capacity:     capacity,
		Budget:       Budget(capacity, len(in.ENIs), in.Limits, unit),
		MaxPods:      in.Limits.MaxPods,
		Short:        t.short(p, prefixMode(in)),
		Surplus:      t.surplus(p),
	}
}

// ENICapacity is how many addresses an attached ENI could hold: the heldAddrs
// of its heldSlots slots at their real size (a /28 kept from prefix mode
// counts 16 even after the mode is turned off, a /32 from the no-/28
// fallback counts 1) plus its free slots, SlotsPerENI − heldSlots, at unit
// addresses each (16 in prefix mode, else 1). It is the one capacity formula:
// Summarize and vpcipd's status, metrics and introspection use it.
func ENICapacity(heldAddrs, heldSlots int, lim Limits, unit int) int {
	return heldAddrs + max(lim.SlotsPerENI-heldSlots, 0)*unit
}

// Budget is how many addresses the node could hold at its ENI limit: the
// capacity of its enis attached ENIs plus, for each ENI it may still attach,
// SlotsPerENI slots of unit addresses.
func Budget(capacity, enis int, lim Limits, unit int) int {
	return capacity + max(lim.MaxENIs-enis, 0)*lim.SlotsPerENI*unit
}
