package api

import "fmt"

// Counts is the node's address pool in numbers: the one shape every
// rendering starts from (the status endpoint here, introspection and
// `vpcipctl`, the vpcip_addresses_* and vpcip_enis_* gauges, the awscni_*
// gauges, the AddressBudget's status).
//
// Address counts are pod addresses: ENI primary addresses are never
// counted. ENI counts are pod ENIs, the ENIs that can hold pod addresses:
// every attached ENI, except the primary ENI under custom networking
// (AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG), which stays in the node's subnet
// and holds none. ENIs and MaxENIs count the same way, so ENIs == MaxENIs
// means no ENI can be added and Budget is what MaxENIs pod ENIs hold
// (warmpool.Budget).
//
// Invariant (Check): Assigned+Warm+Cooling ≤ Capacity ≤ Budget and
// ENIs ≤ MaxENIs, once the instance's limits are known.
type Counts struct {
	Assigned int `json:"assigned"` // addresses held by pods
	Warm     int `json:"warm"`     // free addresses out of cooldown, ready to assign now
	Cooling  int `json:"cooling"`  // released addresses still in IP_COOLDOWN_PERIOD
	Capacity int `json:"capacity"` // addresses the attached pod ENIs could hold at most
	ENIs     int `json:"enis"`     // attached pod ENIs (without the primary under custom networking)
	MaxENIs  int `json:"maxENIs"`  // pod ENIs the instance type allows, capped by MAX_ENI
	Budget   int `json:"budget"`   // addresses the node could hold at MaxENIs pod ENIs
}

// Check reports the first broken invariant of c, or nil. Counts whose
// limits are not known yet (MaxENIs 0) only need non-negative numbers.
func (c Counts) Check() error {
	for _, v := range []int{c.Assigned, c.Warm, c.Cooling, c.Capacity, c.ENIs, c.MaxENIs, c.Budget} {
		if v < 0 {
			return fmt.Errorf("negative count in %+v", c)
		}
	}
	if c.MaxENIs == 0 {
		return nil
	}
	switch {
	case c.Assigned+c.Warm+c.Cooling > c.Capacity:
		return fmt.Errorf("assigned %d + warm %d + cooling %d exceed capacity %d", c.Assigned, c.Warm, c.Cooling, c.Capacity)
	case c.Capacity > c.Budget:
		return fmt.Errorf("capacity %d exceeds budget %d", c.Capacity, c.Budget)
	case c.ENIs > c.MaxENIs:
		return fmt.Errorf("%d ENIs exceed the limit of %d", c.ENIs, c.MaxENIs)
	}
	return nil
}
