package hostnet

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/coreos/go-iptables/iptables"
)

// rule is one iptables rule of a vpcip spec. Every rule we write carries the
// comment "vpcip:<id> <desc>", where id is a hash of table, chain, match and
// target. Convergence compares rules by id, so it never has to parse the
// rule text iptables prints back (which differs between the nft and legacy
// backends and across versions).
type rule struct {
	table, chain string
	desc         string   // human summary, shown in iptables -S
	match        []string // match part, before the comment
	target       []string // "-j" and the target's options
}

func (r rule) id() string {
	h := sha256.New()
	for _, s := range append(append([]string{r.table, r.chain}, r.match...), r.target...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:8]
}

// args is the rulespec handed to iptables.
func (r rule) args() []string {
	out := append([]string(nil), r.match...)
	out = append(out, "-m", "comment", "--comment", "vpcip:"+r.id()+" "+r.desc)
	return append(out, r.target...)
}

var idPattern = regexp.MustCompile(`vpcip:([0-9a-f]{8})`)

// listRules returns the "-A" lines of a chain (iptables -S), in rule order:
// element i is rule number i+1.
func listRules(ipt *iptables.IPTables, table, chain string) ([]string, error) {
	lines, err := ipt.List(table, chain)
	if err != nil {
		return nil, fmt.Errorf("list %s %s: %w", table, chain, err)
	}
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, "-A ") {
			out = append(out, l)
		}
	}
	return out, nil
}

func ruleID(line string) string {
	if m := idPattern.FindStringSubmatch(line); m != nil {
		return m[1]
	}
	return ""
}

// convergeChain makes our chain hold exactly want, in order. It walks the
// wanted rules and inserts each one that is not already at its position, so
// new rules go in ahead of stale ones; only then are the leftovers at the
// tail deleted. A chain that already matches is not touched.
func convergeChain(ipt *iptables.IPTables, table, chain string, want []rule) error {
	exists, err := ipt.ChainExists(table, chain)
	if err != nil {
		return fmt.Errorf("%s %s: %w", table, chain, err)
	}
	if !exists {
		if err := ipt.NewChain(table, chain); err != nil {
			return fmt.Errorf("create %s %s: %w", table, chain, err)
		}
	}
	lines, err := listRules(ipt, table, chain)
	if err != nil {
		return err
	}
	have := make([]string, len(lines))
	for i, l := range lines {
		have[i] = ruleID(l)
	}
	for i, r := range want {
		if i < len(have) && have[i] == r.id() {
			continue
		}
		if err := ipt.Insert(table, chain, i+1, r.args()...); err != nil {
			return fmt.Errorf("insert into %s %s at %d %q: %w", table, chain, i+1, r.args(), err)
		}
		have = append(have[:i], append([]string{r.id()}, have[i:]...)...)
	}
	for n := len(have); n > len(want); n-- {
		if err := ipt.DeleteById(table, chain, n); err != nil {
			return fmt.Errorf("delete stale rule %d of %s %s: %w", n, table, chain, err)
		}
	}
	return nil
}

// jumpPositions returns the rule numbers (1-based) of the rules in parent
// that jump to target.
func jumpPositions(ipt *iptables.IPTables, table, parent, target string) ([]int, []string, error) {
	lines, err := listRules(ipt, table, parent)
	if err != nil {
		return nil, nil, err
	}
	var pos []int
	var ids []string
	for i, l := range lines {
		if strings.HasSuffix(l, " -j "+target) || strings.Contains(l, " -j "+target+" ") {
			pos = append(pos, i+1)
			ids = append(ids, ruleID(l))
		}
	}
	return pos, ids, nil
}

// ensureJump keeps exactly one jump j in its (built-in) chain: inserted at
// the top when first is set, appended otherwise. Extra or outdated jumps to
// the same target are deleted after the wanted one is in place.
func ensureJump(ipt *iptables.IPTables, j rule, first bool) error {
	target := j.target[len(j.target)-1]
	pos, ids, err := jumpPositions(ipt, j.table, j.chain, target)
	if err != nil {
		return err
	}
	keep := -1
	for i, id := range ids {
		if id == j.id() {
			keep = pos[i]
			break
		}
	}
	if keep < 0 {
		if first {
			err = ipt.Insert(j.table, j.chain, 1, j.args()...)
		} else {
			err = ipt.Append(j.table, j.chain, j.args()...)
		}
		if err != nil {
			return fmt.Errorf("add jump %s %s -> %s: %w", j.table, j.chain, target, err)
		}
		if pos, ids, err = jumpPositions(ipt, j.table, j.chain, target); err != nil {
			return err
		}
		for i, id := range ids {
			if id == j.id() {
				keep = pos[i]
				break
			}
		}
	}
	for i := len(pos) - 1; i >= 0; i-- {
		if pos[i] == keep {
			continue
		}
		if err := ipt.DeleteById(j.table, j.chain, pos[i]); err != nil {
			return fmt.Errorf("delete extra jump %s %s #%d: %w", j.table, j.chain, pos[i], err)
		}
	}
	return nil
}

// removeChain deletes every jump from parent to chain (parent "" skips
// that) and then the chain itself. A missing chain is success.
func removeChain(ipt *iptables.IPTables, table, parent, chain string) error {
	if parent != "" {
		pos, _, err := jumpPositions(ipt, table, parent, chain)
		if err != nil && !isNotExist(err) {
			return err
		}
		for i := len(pos) - 1; i >= 0; i-- {
			if err := ipt.DeleteById(table, parent, pos[i]); err != nil {
				return fmt.Errorf("delete jump %s %s -> %s: %w", table, parent, chain, err)
			}
		}
	}
	exists, err := ipt.ChainExists(table, chain)
	if err != nil {
		return fmt.Errorf("%s %s: %w", table, chain, err)
	}
	if !exists {
		return nil
	}
	if err := ipt.ClearAndDeleteChain(table, chain); err != nil {
		return fmt.Errorf("delete %s %s: %w", table, chain, err)
	}
	return nil
}

func isNotExist(err error) bool {
	var e *iptables.Error
	return errors.As(err, &e) && e.IsNotExist()
}
