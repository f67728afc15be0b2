package finality

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/payment"
)

// Settings are the chain settings of every binary that asks the chain
// (the worker's gate, the api's and settlectl's recheck), parsed the same
// way with the same defaults for each.
type Settings struct {
	// Policy and RPCURL are ETH_MAINNET's (DEPOSIT_FINALITY, ETH_RPC_URL).
	Policy chain.Policy
	RPCURL string
	// Networks are the enabled networks (NETWORKS), each with its own RPC
	// (RPC_URL_<NETWORK>) and policy (DEPOSIT_FINALITY_<NETWORK>).
	Networks        []NetworkSettings
	FinalityTimeout time.Duration
	RecheckFirst    time.Duration
	RecheckMax      time.Duration
	CallTimeout     time.Duration
	// ResponseMax bounds one RPC answer's body in bytes.
	ResponseMax int64
	// HintTTL is how long "not final yet" is believed without asking the
	// chain again.
	HintTTL time.Duration
	// ReorgRecheckDelay: two reads of a credited deposit's missing receipt
	// at least this far apart (and a block apart) are evidence of a reorg.
	ReorgRecheckDelay time.Duration
	Breaker           chain.BreakerSettings
}

// NetworkSettings are one enabled network's chain settings.
type NetworkSettings struct {
	Name   string
	RPCURL string // "" without an RPC
	Policy chain.Policy
	// InternalStatusOnly (INTERNAL_TRANSFER_CHECK_<NETWORK>=status)
	// credits internal transfers without their trace.
	InternalStatusOnly bool
}

// RPCSetting names the setting of a network's RPC endpoint.
func RPCSetting(network string) string { return "RPC_URL_" + network }

// The values of INTERNAL_TRANSFER_CHECK: an internal transfer is checked
// against the transaction's call trace, or (the operator's explicit
// choice, for a node without the debug API) by status and finality alone.
const (
	InternalCheckTrace  = "trace"
	InternalCheckStatus = "status"
	internalCheckName   = "INTERNAL_TRANSFER_CHECK"
)

// InternalCheckSetting names a network's INTERNAL_TRANSFER_CHECK.
func InternalCheckSetting(network string) string { return internalCheckName + "_" + network }

// NetworksMax bounds NETWORKS: each network costs a client, a breaker
// and a cache per process.
const NetworksMax = 64

// ReadNetworks reads NETWORKS (default ETH_MAINNET).
func ReadNetworks(env *config.Env) []string {
	raw := env.String("NETWORKS", payment.DefaultNetwork)
	var out []string
	seen := map[string]bool{}
	for _, name := range strings.Split(raw, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "":
			continue
		case !networkName.MatchString(name):
			env.Reject("NETWORKS", fmt.Errorf("%q is not a network name like ETH_MAINNET", name))
			continue
		case seen[name]:
			continue
		}
		seen[name] = true
		out = append(out, name)
	}
	if len(out) == 0 {
		env.Reject("NETWORKS", errors.New("names no network"))
	}
	if len(out) > NetworksMax {
		env.Reject("NETWORKS", fmt.Errorf("names %d networks, more than %d", len(out), NetworksMax))
	}
	return out
}

var networkName = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,63}$`)

// ReadSettings reads the chain settings. rpcRequired is the worker's
// rule: a policy other than none needs an RPC there, while the api and
// settlectl run without one (they only cannot ask the chain).
func ReadSettings(env *config.Env, rpcRequired bool) Settings {
	s := Settings{
		Policy:            config.Parse(env, "DEPOSIT_FINALITY", chain.FinalizedPolicy(), chain.ParsePolicy),
		RPCURL:            env.URL("ETH_RPC_URL", "", "http", "https"),
		FinalityTimeout:   env.Duration("FINALITY_TIMEOUT", TimeoutDefault),
		RecheckFirst:      env.Duration("FINALITY_RECHECK_MIN", RecheckFirstDefault),
		RecheckMax:        env.Duration("FINALITY_RECHECK_MAX", RecheckMaxDefault),
		CallTimeout:       env.Duration("ETH_RPC_TIMEOUT", chain.CallTimeoutDefault),
		ResponseMax:       int64(env.Int(chain.ResponseMaxSetting, chain.ResponseMaxDefault, chain.ResponseMaxMin, chain.ResponseMaxLimit)),
		HintTTL:           env.Duration("FINALITY_HINT_TTL", chain.NotFinalTTLDefault),
		ReorgRecheckDelay: env.Duration("REORG_RECHECK_DELAY", ReorgRecheckDelayDefault),
		Breaker: chain.BreakerSettings{
			ErrorsMax:   env.Int("ETH_RPC_BREAKER_ERRORS", chain.BreakerErrorsMaxDefault, 1, 1000),
			ErrorWindow: env.Duration("ETH_RPC_BREAKER_WINDOW", chain.BreakerErrorWindowDefault),
			OpenFor:     env.Duration("ETH_RPC_BREAKER_OPEN_FOR", chain.BreakerOpenForDefault),
		},
	}
	mainnet := env.URL(RPCSetting(payment.DefaultNetwork), "", "http", "https")
	switch {
	case mainnet != "" && s.RPCURL != "" && mainnet != s.RPCURL:
		env.Reject(RPCSetting(payment.DefaultNetwork), errors.New("differs from ETH_RPC_URL, its alias: set one of them"))
	case mainnet != "":
		s.RPCURL = mainnet
	}
	// Every network's default is DEPOSIT_FINALITY, never another network's
	// override (s.Policy becomes ETH_MAINNET's below).
	base := s.Policy
	internalCheck := env.OneOf(internalCheckName, InternalCheckTrace, InternalCheckTrace, InternalCheckStatus)
	for _, name := range ReadNetworks(env) {
		n := NetworkSettings{Name: name, Policy: config.Parse(env, "DEPOSIT_FINALITY_"+name, base, chain.ParsePolicy)}
		n.InternalStatusOnly = env.OneOf(InternalCheckSetting(name), internalCheck, InternalCheckTrace, InternalCheckStatus) == InternalCheckStatus
		if name == payment.DefaultNetwork {
			n.RPCURL, s.Policy = s.RPCURL, n.Policy
		} else {
			n.RPCURL = env.URL(RPCSetting(name), "", "http", "https")
		}
		if rpcRequired && n.RPCURL == "" && n.Policy.Kind() != chain.None {
			// ETH_MAINNET's is named ETH_RPC_URL, as CONTRACT.md's
			// settings table does: its alias is the later name.
			setting, alias := RPCSetting(name), ""
			if name == payment.DefaultNetwork {
				setting, alias = "ETH_RPC_URL", " (or its alias "+RPCSetting(name)+")"
			}
			env.Reject(setting, fmt.Errorf("required%s when the finality policy of %s is %s (DEPOSIT_FINALITY_%s or DEPOSIT_FINALITY)", alias, name, n.Policy, name))
		}
		s.Networks = append(s.Networks, n)
	}
	return s
}

// HasRPC tells whether the chain can be asked on any enabled network.
func (s Settings) HasRPC() bool {
	for _, n := range s.Networks {
		if n.RPCURL != "" {
			return true
		}
	}
	return s.RPCURL != "" && len(s.Networks) == 0
}

// CheckListed refuses enabled networks (NETWORKS) the networks table does
// not list: a typo there would refuse every event on the network meant,
// so a binary stops at start instead, naming the setting.
func (s Settings) CheckListed(registry *payment.Registry) error {
	var unlisted []string
	for _, n := range s.networks() {
		if _, ok := registry.Network(n.Name); !ok {
			unlisted = append(unlisted, n.Name)
		}
	}
	if len(unlisted) == 0 {
		return nil
	}
	return fmt.Errorf("setting NETWORKS: %s not in the networks table; fix the name, or add the network first (settlectl networks add)", strings.Join(unlisted, ", "))
}

// RPCNetworks are the enabled networks whose chain can be asked.
func (s Settings) RPCNetworks() []string {
	var names []string
	for _, n := range s.networks() {
		if n.RPCURL != "" {
			names = append(names, n.Name)
		}
	}
	return names
}

// NetworkNames are the enabled networks' names.
func (s Settings) NetworkNames() []string {
	names := make([]string, 0, len(s.Networks))
	for _, n := range s.networks() {
		names = append(names, n.Name)
	}
	return names
}

// networks are the enabled networks; ETH_MAINNET alone for settings
// built by hand (tests) without any.
func (s Settings) networks() []NetworkSettings {
	if len(s.Networks) == 0 {
		return []NetworkSettings{{Name: payment.DefaultNetwork, RPCURL: s.RPCURL, Policy: s.Policy}}
	}
	return s.Networks
}

// Deps are what Open builds a gate on.
type Deps struct {
	Store  Store
	Assets *payment.Registry
	// Redis shares the breaker's state and the finality cache across
	// processes; nil keeps both in-process.
	Redis      redis.UniversalClient
	Alerts     Alerter
	Log        zerolog.Logger
	Registerer prometheus.Registerer
}

// Clients are the RPC clients of the enabled networks that have one.
type Clients map[string]*chain.Client

// Close releases every client.
func (c Clients) Close() {
	for _, client := range c {
		client.Close()
	}
}

// Dial prepares one client per enabled network with an RPC, each with
// its own breaker (shared through Redis under the network's name), and
// its metrics labelled with the network. It does not contact the nodes.
// With the registry (d.Assets), each client answers nothing until its
// node has said it serves the network's chain (chain.ClientOptions.ChainID).
func Dial(ctx context.Context, s Settings, d Deps) (Clients, error) {
	clients := Clients{}
	for _, n := range s.networks() {
		if n.RPCURL == "" {
			continue
		}
		breaker := s.Breaker
		breaker.Name = n.Name
		var reg prometheus.Registerer
		if d.Registerer != nil {
			reg = prometheus.WrapRegistererWith(prometheus.Labels{"network": n.Name}, d.Registerer)
		}
		var chainID int64
		if d.Assets != nil {
			if network, ok := d.Assets.Network(n.Name); ok {
				chainID = network.ChainID
			}
		}
		client, err := chain.Dial(ctx, n.RPCURL, chain.ClientOptions{
			Redis: d.Redis, Registerer: reg, Alerter: d.Alerts, Logger: d.Log.With().Str("network", n.Name).Logger(),
			CallTimeout: s.CallTimeout, Breaker: breaker, ResponseMax: s.ResponseMax, ChainID: chainID,
		})
		if err != nil {
			clients.Close()
			return nil, fmt.Errorf("%s: %w", rpcSettingOf(n.Name), err)
		}
		clients[n.Name] = client
	}
	return clients, nil
}

// rpcSettingOf names the setting an operator wrote for a network's RPC.
func rpcSettingOf(network string) string {
	if network == payment.DefaultNetwork {
		return "ETH_RPC_URL or " + RPCSetting(network)
	}
	return RPCSetting(network)
}

// ErrWrongChain: an RPC endpoint serves another chain than its network's.
var ErrWrongChain = chain.ErrWrongChain

// CheckChainIDs asks every client for eth_chainId and compares it with
// the network's chain id in the registry. A mismatch (or a network whose
// chain id settle does not know) is ErrWrongChain naming the setting; an
// endpoint that cannot be reached is left out of the error and returned
// in unreachable, to be checked again later (a worker starts while a node
// is down).
func CheckChainIDs(ctx context.Context, clients Clients, registry *payment.Registry) (unreachable []string, err error) {
	var wrong []error
	for name, client := range clients {
		network, known := registry.Network(name)
		if !known || network.ChainID == 0 {
			wrong = append(wrong, fmt.Errorf("%w: %s is set, but network %s has no chain id in the networks table (settlectl networks add)", ErrWrongChain, rpcSettingOf(name), name))
			continue
		}
		id, askErr := client.ChainID(ctx)
		if askErr != nil {
			unreachable = append(unreachable, name)
			continue
		}
		if id != network.ChainID {
			wrong = append(wrong, fmt.Errorf("%w: %s answers eth_chainId %d, but network %s is chain %d", ErrWrongChain, rpcSettingOf(name), id, name, network.ChainID))
		}
	}
	sort.Strings(unreachable)
	return unreachable, errors.Join(wrong...)
}

// Open dials the enabled networks' RPCs and builds the gate on them;
// without any RPC endpoint there is no gate (nil). The returned function
// releases the clients. The chain ids are not checked here (see
// CheckChainIDs), so that the api and settlectl need no node to start.
func Open(ctx context.Context, s Settings, d Deps) (*Gate, func(), error) {
	if !s.HasRPC() {
		return nil, func() {}, nil
	}
	clients, err := Dial(ctx, s, d)
	if err != nil {
		return nil, nil, err
	}
	return NewOnClients(s, d, clients), clients.Close, nil
}

// NewOnClients builds the gate on clients already dialled.
func NewOnClients(s Settings, d Deps, clients Clients) *Gate {
	networks := map[string]NetworkChain{}
	unchecked := map[string]bool{}
	for _, n := range s.networks() {
		client, ok := clients[n.Name]
		if !ok {
			if n.Policy.Kind() == chain.None {
				unchecked[n.Name] = true
			}
			continue
		}
		var reg prometheus.Registerer
		if d.Registerer != nil {
			reg = prometheus.WrapRegistererWith(prometheus.Labels{"network": n.Name}, d.Registerer)
		}
		networks[n.Name] = NetworkChain{
			Chain: chain.NewChecker(client, chain.CheckerOptions{
				Redis: d.Redis, Registerer: reg, NotFinalTTL: s.HintTTL, Network: n.Name, InternalStatusOnly: n.InternalStatusOnly,
			}),
			Policy: n.Policy,
		}
	}
	return New(Options{
		Store: d.Store, Networks: networks, Unchecked: unchecked,
		Assets: d.Assets, Timeout: s.FinalityTimeout,
		RecheckFirst: s.RecheckFirst, RecheckMax: s.RecheckMax, ReorgRecheckDelay: s.ReorgRecheckDelay,
		Alerts: d.Alerts, Log: d.Log, Registerer: d.Registerer,
	})
}
