package ipamd

// PodsHolding returns "namespace/name" of every pod that holds an address,
// for the Kubernetes part's demand (pods bound to the node without one).
func (d *Daemon) PodsHolding() map[string]bool {
	held := map[string]bool{}
	for _, a := range d.store.Assignments() {
		if a.Pod.Name != "" {
			held[a.Pod.Namespace+"/"+a.Pod.Name] = true
		}
	}
	return held
}
