package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelOptions configure a Redis deployment under Sentinel: one
// master, its replicas, and the sentinel processes that watch them.
type SentinelOptions struct {
	// Dir holds every server's directory; empty means a temp dir that
	// Close removes.
	Dir string
	// MasterName is the name the sentinels know the master by; empty
	// means "settle".
	MasterName string
	// Replicas of the master; 0 means 1.
	Replicas int
	// Sentinels watching; 0 means 3. The quorum is a majority of them.
	Sentinels int
	// DownAfter is how long the master may not answer before a sentinel
	// counts it down; 0 means 1s (production uses tens of seconds).
	DownAfter time.Duration
	// FailoverTimeout bounds one failover attempt; a sentinel retries a
	// failed election after twice this. 0 means 5s.
	FailoverTimeout time.Duration
	// Databases per data node; 0 means 16.
	Databases int
}

// Sentinel is a running master, its replicas and their sentinels.
type Sentinel struct {
	MasterName string
	// Nodes are the data nodes; Nodes[0] is the first master.
	Nodes     []*Redis
	Sentinels []*SentinelServer
	Dir       string
	temp      bool
}

// SentinelServer is one redis-sentinel process.
type SentinelServer struct {
	Port int
	Dir  string
	proc process
}

// RedisSentinelPath finds redis-sentinel.
func RedisSentinelPath() (string, error) {
	if path, err := exec.LookPath("redis-sentinel"); err == nil {
		return path, nil
	}
	return "", errors.New("redis-sentinel not found (install Debian's redis-sentinel package; .ci/run does)")
}

// StartSentinel starts the data nodes, makes all but the first replicas
// of it, starts the sentinels, and waits until every sentinel knows every
// replica and every other sentinel, so that a failover can be elected.
func StartSentinel(ctx context.Context, opts SentinelOptions) (*Sentinel, error) {
	if opts.MasterName == "" {
		opts.MasterName = "settle"
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.Sentinels == 0 {
		opts.Sentinels = 3
	}
	if opts.DownAfter == 0 {
		opts.DownAfter = time.Second
	}
	if opts.FailoverTimeout == 0 {
		opts.FailoverTimeout = 5 * time.Second
	}
	sentinelPath, err := RedisSentinelPath()
	if err != nil {
		return nil, err
	}
	s := &Sentinel{MasterName: opts.MasterName, Dir: opts.Dir}
	if s.Dir, s.temp, err = workDir(s.Dir, "settle-sentinel-"); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 2*startTimeout)
	defer cancel()
	for i := range 1 + opts.Replicas {
		node, err := StartRedis(ctx, RedisOptions{Dir: filepath.Join(s.Dir, fmt.Sprintf("node-%d", i)), Databases: opts.Databases})
		if err != nil {
			return nil, err
		}
		s.Nodes = append(s.Nodes, node)
	}
	master := s.Nodes[0]
	for _, replica := range s.Nodes[1:] {
		if err := replicate(ctx, replica, master); err != nil {
			return nil, err
		}
	}
	quorum := opts.Sentinels/2 + 1
	for i := range opts.Sentinels {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(s.Dir, fmt.Sprintf("sentinel-%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		// Sentinel rewrites its file as it learns the topology, so it
		// must be writable and its own.
		conf := strings.Join([]string{
			"port " + strconv.Itoa(port),
			"bind 127.0.0.1",
			"daemonize no",
			"dir " + dir,
			"logfile " + filepath.Join(dir, "sentinel.log"),
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d", opts.MasterName, master.Port, quorum),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", opts.MasterName, opts.DownAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", opts.MasterName, opts.FailoverTimeout.Milliseconds()),
			fmt.Sprintf("sentinel parallel-syncs %s 1", opts.MasterName),
		}, "\n") + "\n"
		confPath := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		server := &SentinelServer{Port: port, Dir: dir}
		if err := server.proc.start(exec.Command(sentinelPath, confPath)); err != nil {
			return nil, fmt.Errorf("start redis-sentinel: %w", err)
		}
		s.Sentinels = append(s.Sentinels, server)
		if err := waitTCP(ctx, server.Addr(), server.proc.done); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, tail(filepath.Join(dir, "sentinel.log"), 20))
		}
	}
	if err := s.waitDiscovered(ctx, opts.Replicas, opts.Sentinels-1); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// replicate makes replica follow master and waits for the link to be up.
func replicate(ctx context.Context, replica, master *Redis) error {
	c := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	defer c.Close()
	if err := c.Do(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(master.Port)).Err(); err != nil {
		return fmt.Errorf("replicaof: %w", err)
	}
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replica %s never linked to %s: %w", replica.Addr(), master.Addr(), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitDiscovered waits until every sentinel lists the replicas and the
// other sentinels (they find each other through the master every 2s).
func (s *Sentinel) waitDiscovered(ctx context.Context, replicas, peers int) error {
	for _, server := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: server.Addr()})
		err := func() error {
			defer c.Close()
			for {
				gotReplicas, err1 := c.Replicas(ctx, s.MasterName).Result()
				gotPeers, err2 := c.Sentinels(ctx, s.MasterName).Result()
				if err1 == nil && err2 == nil && len(gotReplicas) >= replicas && len(gotPeers) >= peers {
					return nil
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("sentinel %s sees %d of %d replicas and %d of %d peers: %w",
						server.Addr(), len(gotReplicas), replicas, len(gotPeers), peers, ctx.Err())
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
		if err != nil {
			return fmt.Errorf("%w\n%s", err, tail(filepath.Join(server.Dir, "sentinel.log"), 20))
		}
	}
	return nil
}

// URL is the REDIS_URL that reaches logical database db through the
// sentinels.
func (s *Sentinel) URL(db int) string {
	addrs := make([]string, len(s.Sentinels))
	for i, server := range s.Sentinels {
		addrs[i] = server.Addr()
	}
	return fmt.Sprintf("redis-sentinel://%s/%s/%d", strings.Join(addrs, ","), s.MasterName, db)
}

// WaitForMaster waits until every running sentinel names a master other
// than old and that node answers as a master; it returns the node.
func (s *Sentinel) WaitForMaster(ctx context.Context, old *Redis, timeout time.Duration) (*Redis, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if node := s.agreedMaster(ctx); node != nil && node != old {
			return node, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no failover away from %s: %w\n%s", old.Addr(), ctx.Err(), s.SentinelLogs(10))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Sentinel) agreedMaster(ctx context.Context) *Redis {
	var agreed string
	for _, server := range s.Sentinels {
		if !server.proc.running() {
			continue
		}
		c := redis.NewSentinelClient(&redis.Options{Addr: server.Addr()})
		addr, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
		c.Close()
		if err != nil || len(addr) != 2 {
			return nil
		}
		got := addr[0] + ":" + addr[1]
		if agreed != "" && got != agreed {
			return nil
		}
		agreed = got
	}
	for _, node := range s.Nodes {
		if node.Addr() != agreed || !node.proc.running() {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: node.Addr()})
		info, err := c.Info(ctx, "replication").Result()
		c.Close()
		if err == nil && strings.Contains(info, "role:master") {
			return node
		}
	}
	return nil
}

// SentinelLogs is the tail of every sentinel's log, for failure reports.
func (s *Sentinel) SentinelLogs(lines int) string {
	var b strings.Builder
	for _, server := range s.Sentinels {
		fmt.Fprintf(&b, "---- sentinel %s ----\n%s\n", server.Addr(), tail(filepath.Join(server.Dir, "sentinel.log"), lines))
	}
	return b.String()
}

// Close stops every sentinel and node and removes a temp dir.
func (s *Sentinel) Close() {
	for _, server := range s.Sentinels {
		server.Stop()
	}
	for _, node := range s.Nodes {
		node.Close()
	}
	if s.temp {
		_ = os.RemoveAll(s.Dir)
	}
}

// Addr is host:port.
func (s *SentinelServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

// Stop shuts the sentinel down.
func (s *SentinelServer) Stop() { s.proc.stop(syscall.SIGTERM, 10*time.Second) }
