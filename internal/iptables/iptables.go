// Package iptables is what orch's network code asks of iptables (the pod
// network's masquerade rule today, the service proxy's chains next): a
// small interface over github.com/coreos/go-iptables, which finds the
// right binary (nf_tables or legacy back end, as Raspberry Pi OS and
// Debian differ) and takes the xtables lock, and a Fake that keeps rules
// in maps for unit tests that need no root.
package iptables

import (
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"

	goipt "github.com/coreos/go-iptables/iptables"
)

// Interface is the iptables a node's network code uses. Rules are rule
// specifications as iptables takes them after the chain name.
type Interface interface {
	// EnsureChain creates chain in table unless it exists.
	EnsureChain(table, chain string) error
	// EnsureRule appends rule to chain unless an identical rule is there.
	EnsureRule(table, chain string, rule ...string) error
	// EnsureFirstRule inserts rule at the head of chain unless an
	// identical rule is there: kube-proxy's jumps go before what other
	// programs append (a pod network's ACCEPTs in FORWARD).
	EnsureFirstRule(table, chain string, rule ...string) error
	// DeleteRule removes rule from chain if it is there.
	DeleteRule(table, chain string, rule ...string) error
	// Rules lists chain's rules as iptables -S prints them (the first
	// line creates the chain).
	Rules(table, chain string) ([]string, error)
	// Chains lists table's chains, built-in ones included.
	Chains(table string) ([]string, error)
	// Restore applies data, iptables-restore input for one table, in one
	// transaction and without flushing what it does not name (--noflush):
	// the way to write many rules at once, as kube-proxy does.
	Restore(table string, data []byte) error
}

// IPv4 is the host's IPv4 iptables.
func IPv4() (Interface, error) {
	ipt, err := goipt.NewWithProtocol(goipt.ProtocolIPv4)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	return real{ipt}, nil
}

type real struct{ ipt *goipt.IPTables }

func (r real) EnsureChain(table, chain string) error {
	ok, err := r.ipt.ChainExists(table, chain)
	if err != nil {
		return fmt.Errorf("iptables -t %s -L %s: %w", table, chain, err)
	}
	if ok {
		return nil
	}
	if err := r.ipt.NewChain(table, chain); err != nil {
		return fmt.Errorf("iptables -t %s -N %s: %w", table, chain, err)
	}
	return nil
}

func (r real) EnsureRule(table, chain string, rule ...string) error {
	if err := r.ipt.AppendUnique(table, chain, rule...); err != nil {
		return fmt.Errorf("iptables -t %s -A %s %s: %w", table, chain, strings.Join(rule, " "), err)
	}
	return nil
}

func (r real) EnsureFirstRule(table, chain string, rule ...string) error {
	ok, err := r.ipt.Exists(table, chain, rule...)
	if err != nil {
		return fmt.Errorf("iptables -t %s -C %s %s: %w", table, chain, strings.Join(rule, " "), err)
	}
	if ok {
		return nil
	}
	if err := r.ipt.Insert(table, chain, 1, rule...); err != nil {
		return fmt.Errorf("iptables -t %s -I %s 1 %s: %w", table, chain, strings.Join(rule, " "), err)
	}
	return nil
}

func (r real) DeleteRule(table, chain string, rule ...string) error {
	if err := r.ipt.DeleteIfExists(table, chain, rule...); err != nil {
		return fmt.Errorf("iptables -t %s -D %s %s: %w", table, chain, strings.Join(rule, " "), err)
	}
	return nil
}

func (r real) Rules(table, chain string) ([]string, error) {
	rules, err := r.ipt.List(table, chain)
	if err != nil {
		return nil, fmt.Errorf("iptables -t %s -S %s: %w", table, chain, err)
	}
	return rules, nil
}

func (r real) Chains(table string) ([]string, error) {
	chains, err := r.ipt.ListChains(table)
	if err != nil {
		return nil, fmt.Errorf("iptables -t %s -S: %w", table, err)
	}
	return chains, nil
}

func (r real) Restore(table string, data []byte) error {
	// iptables-restore from the same alternatives as iptables, so that
	// both speak to one back end (nf_tables or legacy); -w takes the
	// xtables lock as iptables does (iptables 1.6.2 and later).
	return run("iptables-restore", data, "--noflush", "-w", "5")
}

func run(name string, stdin []byte, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// builtinChains exist in a fresh Fake, as in the kernel.
var builtinChains = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":    {"PREROUTING", "OUTPUT"},
}

// Fake is an Interface over maps: rules are compared as their joined
// words, as iptables -C compares them after normalising.
type Fake struct {
	mu     sync.Mutex
	chains map[string][]string // "table/chain" → rules
}

// NewFake has the kernel's built-in chains, empty.
func NewFake() *Fake {
	f := &Fake{chains: map[string][]string{}}
	for table, chains := range builtinChains {
		for _, c := range chains {
			f.chains[table+"/"+c] = nil
		}
	}
	return f
}

func (f *Fake) chain(table, chain string) ([]string, error) {
	rules, ok := f.chains[table+"/"+chain]
	if !ok {
		return nil, fmt.Errorf("iptables -t %s: chain %s does not exist", table, chain)
	}
	return rules, nil
}

// EnsureChain implements Interface.
func (f *Fake) EnsureChain(table, chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.chains[table+"/"+chain]; !ok {
		f.chains[table+"/"+chain] = nil
	}
	return nil
}

// EnsureRule implements Interface.
func (f *Fake) EnsureRule(table, chain string, rule ...string) error {
	return f.ensure(table, chain, false, rule)
}

// EnsureFirstRule implements Interface.
func (f *Fake) EnsureFirstRule(table, chain string, rule ...string) error {
	return f.ensure(table, chain, true, rule)
}

func (f *Fake) ensure(table, chain string, first bool, rule []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, err := f.chain(table, chain)
	if err != nil {
		return err
	}
	spec := strings.Join(rule, " ")
	switch {
	case slices.Contains(rules, spec):
	case first:
		f.chains[table+"/"+chain] = append([]string{spec}, rules...)
	default:
		f.chains[table+"/"+chain] = append(rules, spec)
	}
	return nil
}

// DeleteRule implements Interface.
func (f *Fake) DeleteRule(table, chain string, rule ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, err := f.chain(table, chain)
	if err != nil {
		return err
	}
	if i := slices.Index(rules, strings.Join(rule, " ")); i >= 0 {
		f.chains[table+"/"+chain] = slices.Delete(rules, i, i+1)
	}
	return nil
}

// Rules implements Interface, in iptables -S's form.
func (f *Fake) Rules(table, chain string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, err := f.chain(table, chain)
	if err != nil {
		return nil, err
	}
	out := []string{"-N " + chain}
	if slices.Contains(builtinChains[table], chain) {
		out[0] = "-P " + chain + " ACCEPT"
	}
	for _, r := range rules {
		out = append(out, "-A "+chain+" "+r)
	}
	return out, nil
}

// Chains implements Interface.
func (f *Fake) Chains(table string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for key := range f.chains {
		if t, c, _ := strings.Cut(key, "/"); t == table {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Restore implements Interface for what iptables-restore --noflush takes:
// ":CHAIN" declares (and flushes) a chain, "-A CHAIN rule" appends, "-D
// CHAIN rule" deletes a rule that must be there, "-X CHAIN" deletes a
// chain, all between "*table" and "COMMIT", applied whole or not at all.
func (f *Fake) Restore(table string, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	next := make(map[string][]string, len(f.chains))
	for k, rules := range f.chains {
		next[k] = slices.Clone(rules)
	}
	committed := false
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		fail := func(format string, args ...any) error {
			return fmt.Errorf("iptables-restore: line %d: %s", n+1, fmt.Sprintf(format, args...))
		}
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case committed:
			return fail("after COMMIT")
		case strings.HasPrefix(line, "*"):
			if line[1:] != table {
				return fail("table %s, want %s", line[1:], table)
			}
		case line == "COMMIT":
			committed = true
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			next[table+"/"+name] = nil
		case strings.HasPrefix(line, "-A "):
			chain, rule, _ := strings.Cut(line[3:], " ")
			if _, ok := next[table+"/"+chain]; !ok {
				return fail("chain %s does not exist", chain)
			}
			if target := jumpTarget(rule); target != "" && !targets[target] {
				if _, ok := next[table+"/"+target]; !ok {
					return fail("chain %s does not exist", target)
				}
			}
			next[table+"/"+chain] = append(next[table+"/"+chain], rule)
		case strings.HasPrefix(line, "-D "):
			chain, rule, _ := strings.Cut(line[3:], " ")
			i := slices.Index(next[table+"/"+chain], rule)
			if i < 0 {
				return fail("no rule %q in chain %s", rule, chain)
			}
			next[table+"/"+chain] = slices.Delete(next[table+"/"+chain], i, i+1)
		case strings.HasPrefix(line, "-X "):
			chain := strings.TrimSpace(line[3:])
			for key, rules := range next {
				t, _, _ := strings.Cut(key, "/")
				if t != table {
					continue
				}
				for _, r := range rules {
					if strings.HasSuffix(r, "-j "+chain) || strings.Contains(r, "-j "+chain+" ") {
						return fail("chain %s is still jumped to from %s", chain, key)
					}
				}
			}
			delete(next, table+"/"+chain)
		default:
			return fail("cannot parse %q", line)
		}
	}
	if !committed {
		return fmt.Errorf("iptables-restore: no COMMIT")
	}
	f.chains = next
	return nil
}

// targets are the jump targets that are not chains.
var targets = map[string]bool{"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true, "MASQUERADE": true,
	"SNAT": true, "DNAT": true, "MARK": true, "LOG": true, "CONNMARK": true, "REDIRECT": true}

// jumpTarget is what a rule jumps to (-j), if anything.
func jumpTarget(rule string) string {
	words := strings.Fields(rule)
	for i, w := range words {
		if (w == "-j" || w == "--jump") && i+1 < len(words) {
			return words[i+1]
		}
	}
	return ""
}

// RemoveOwned removes from table, in one iptables-restore transaction,
// what one owner made: the rules of other chains that jump to a chain
// ownedChain names or that ownedRule recognises (given as iptables -S
// prints them), then the owned chains themselves. It returns how many
// rules and chains it removed; a table holding none of them is left alone.
func RemoveOwned(ipt Interface, table string, ownedChain func(chain string) bool, ownedRule func(rule string) bool) (int, error) {
	chains, err := ipt.Chains(table)
	if err != nil {
		return 0, err
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "*%s\n", table)
	var owned []string
	removed := 0
	for _, chain := range chains {
		if ownedChain(chain) {
			owned = append(owned, chain)
			fmt.Fprintf(&buf, ":%s - [0:0]\n", chain)
			continue
		}
		rules, err := ipt.Rules(table, chain)
		if err != nil {
			return 0, err
		}
		for _, r := range rules {
			spec, ok := strings.CutPrefix(r, "-A "+chain+" ")
			if !ok {
				continue
			}
			if target := jumpTarget(spec); (target != "" && ownedChain(target)) || ownedRule(spec) {
				fmt.Fprintf(&buf, "-D %s %s\n", chain, spec)
				removed++
			}
		}
	}
	for _, chain := range owned {
		fmt.Fprintf(&buf, "-X %s\n", chain)
	}
	removed += len(owned)
	if removed == 0 {
		return 0, nil
	}
	buf.WriteString("COMMIT\n")
	if err := ipt.Restore(table, buf.Bytes()); err != nil {
		return 0, err
	}
	return removed, nil
}

// Discard is iptables that keeps nothing: for measuring what builds rules
// apart from the kernel that takes them.
type Discard struct{}

// EnsureChain does nothing.
func (Discard) EnsureChain(string, string) error { return nil }

// EnsureRule does nothing.
func (Discard) EnsureRule(string, string, ...string) error { return nil }

// EnsureFirstRule does nothing.
func (Discard) EnsureFirstRule(string, string, ...string) error { return nil }

// DeleteRule does nothing.
func (Discard) DeleteRule(string, string, ...string) error { return nil }

// Rules has none.
func (Discard) Rules(string, string) ([]string, error) { return nil, nil }

// Chains has none.
func (Discard) Chains(string) ([]string, error) { return nil, nil }

// Restore takes data and keeps nothing of it.
func (Discard) Restore(string, []byte) error { return nil }
