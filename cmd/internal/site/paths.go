package site

// Where init's files go on a host. The package's units read them there
// (deploy/systemd), so they are not settings.
const (
	// EtcDir holds every service's configuration (root:fan 0750).
	EtcDir = "/etc/fan"
	// BusDir holds the host's bus identities: one nkey seed, certificate
	// and key per service, and the CA.
	BusDir = EtcDir + "/bus"
	// NATSDir holds the host's NATS server configuration, certificate and
	// key; StoreDir is its JetStream store.
	NATSDir  = EtcDir + "/nats"
	StoreDir = "/var/lib/fan/nats"
	// StatusDir holds the status page's configuration, identity and token.
	// It is apart from EtcDir, readable by the page's own user only: the
	// page faces browsers, and a compromised page must not read any other
	// identity's seed.
	StatusDir = "/etc/fan-status"
	// SysctlFile makes hot standby possible: Asterisk binds the floating
	// address before the host holds it.
	SysctlFile = "/etc/sysctl.d/60-fan.conf"
	// AsteriskDir is Asterisk's configuration; ManagerInclude, relative to
	// it, holds fan's AMI user.
	AsteriskDir    = "/etc/asterisk"
	ManagerInclude = "manager.d/fan.conf"
	ManagerConf    = "manager.conf"
	// IPMoverState and ReplicatorState are the executors' state, made by
	// the package (tmpfiles.d).
	IPMoverState    = "/var/lib/fan/ipmover/state.json"
	ReplicatorState = "/var/lib/fan/replicator"
)

// Users and groups the package creates (sysusers.d).
const (
	// UserFan runs every service but the replicator (root, for file
	// ownership) and the status page.
	UserFan = "fan"
	// UserStatus runs the status page, apart from fan's services.
	UserStatus = "fan-status"
)

// The services' /metrics and /healthz ports (loopback unless the site
// file's metrics_listen says host).
var metricsPort = map[string]int{
	"prober":     9101,
	"ipmover":    9102,
	"replicator": 9103,
	"arbiter":    9104,
	"scheduler":  9105,
}
