package config

import "slices"

// Map is the effective configuration by variable name (one entry per row of
// Vars), for the start-up log line and the introspection endpoint. Durations
// are Go durations.
func (c Config) Map() map[string]string {
	m := make(map[string]string, len(Vars))
	for _, v := range Vars {
		if v.show != nil {
			m[v.Name] = v.show(&c)
		}
	}
	return m
}

// Names lists every variable Parse reads, aliases included, sorted (vpcipd
// prints it in its usage text).
func Names() []string {
	var names []string
	for _, v := range Vars {
		names = append(names, v.Name)
		names = append(names, v.Aliases...)
	}
	slices.Sort(names)
	return names
}
