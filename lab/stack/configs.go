package stack

// configTemplates are the lab's service configuration files. They are also
// the shortest complete examples of each service's configuration.
var configTemplates = map[string]string{
	"prober": `cluster: {{.Cluster}}
node: {{.Node}}
bus:
  url: {{.NATS}}
{{- template "busauth" .}}
{{- if gt .Replicas 1}}
  replicas: {{.Replicas}}
{{- end}}
heartbeat_interval: 1s
presence_interval: {{.PresenceInterval}}
checks:
  - name: asterisk-ami
    kind: ami
    role: self
    address: {{.AMIAddr}}
    username: {{.AMIUser}}
    secret: {{.AMISecret}}
    interval: {{.Interval}}
    timeout: {{.Timeout}}
    rise: {{.Rise}}
    fall: {{.Fall}}
  - name: asterisk-sip
    kind: sip
    role: self
    address: {{.NodeAddr}}:5060
    interval: {{.Interval}}
    timeout: {{.Timeout}}
    rise: {{.Rise}}
    fall: {{.Fall}}
{{- range $peer, $addr := .NodeAddrs}}{{if ne $peer $.Node}}
  - name: peer-{{$peer}}
    kind: sip
    role: peer
    target_node: {{$peer}}
    address: {{$addr}}:5060
    interval: {{$.PeerInterval}}
    timeout: {{$.PeerTimeout}}
{{- if $.PeerDecisiveMargin}}
    decisive_margin: {{$.PeerDecisiveMargin}}
{{- end}}
    rise: {{$.Rise}}
    fall: {{$.Fall}}
{{- end}}{{end}}
groups:
  - name: asterisk
    min_up: 2
    checks: [asterisk-ami, asterisk-sip]
`,
	"ipmover": `cluster: {{.Cluster}}
node: {{.Node}}
bus:
  url: {{.NATS}}
{{- template "busauth" .}}
{{- if gt .Replicas 1}}
  replicas: {{.Replicas}}
{{- end}}
interface: eth0
# The only group and address this executor may ever hold.
groups:
  - name: pbx
    prefixes: [{{.VIP}}]
state_file: {{.Dir}}/{{.Node}}-ipmover-state.json
answer:
  mode: hot
ami:
  address: {{.AMIAddr}}
  username: {{.AMIUser}}
  secret: {{.AMISecret}}
verify:
  port: 5060
  timeout: 3s
claim:
  probe_wait: 100ms
bus_loss:
  policy: hold
`,
	"replicator": `cluster: {{.Cluster}}
node: {{.Node}}
bus:
  url: {{.NATS}}
{{- template "busauth" .}}
{{- if gt .Replicas 1}}
  replicas: {{.Replicas}}
{{- end}}
group: {{.Group}}
state_dir: {{.Dir}}/{{.Node}}-replicator/state
scan_interval: 5s
# A pass stores at most 1 MiB of new contents in the bus and the holder
# serves the rest to its peers (direct transfer), so the lab's small trees
# take both paths.
store_pass_mib: 1
# The lab's trees live in its temp dir, one set per node, never in the
# machine's /etc/asterisk; create makes the empty roots on start.
trees:
  - name: asterisk-etc
    path: {{.Dir}}/{{.Node}}-replicator/etc-asterisk
    create: true
  - name: voicemail
    path: {{.Dir}}/{{.Node}}-replicator/voicemail
    exclude: [tmp/]
    create: true
astdb:
  enabled: true
  families: [registrar]
  interval: 1s
  ami:
    address: {{.AMIAddr}}
    username: {{.AMIUser}}
    secret: {{.AMISecret}}
`,
	"scheduler": `cluster: {{.Cluster}}
node: {{.Node}}
bus:
  url: {{.NATS}}
{{- template "busauth" .}}
{{- if gt .Replicas 1}}
  replicas: {{.Replicas}}
{{- end}}
# No groups, so no failback windows: no permit is ever published and the
# arbiter never fails back on its own in the lab.
`,
	"arbiter": `cluster: {{.Cluster}}
node: {{.Node}}
{{- if .Standby}}
# A replica on a PBX host leads only while no other replica is alive.
standby: true
{{- end}}
bus:
  url: {{.NATS}}
{{- template "busauth" .}}
{{- if gt .Replicas 1}}
  replicas: {{.Replicas}}
{{- end}}
{{- if .LeaderServers}}
  leader_servers: [{{range $i, $n := .LeaderServers}}{{if $i}}, {{end}}{{$n}}{{end}}]
{{- end}}
{{- if .SystemSeed}}
  system:
    nkey_seed: {{.SystemSeed}}
{{- else if .SystemUser}}
  system:
    user: {{.SystemUser}}
    password: {{.SystemPassword}}
{{- end}}
lease_ttl: 2s
groups:
  - name: {{.Group}}
    addresses: [{{.VIP}}]
    nodes: [{{range $i, $n := .Nodes}}{{if $i}}, {{end}}{{$n}}{{end}}]
    health_check: asterisk
{{- if or .MaxMovesPerHour .PresenceGrace .ArbiterTick}}
policy:
{{- if .MaxMovesPerHour}}
  max_moves_per_hour: {{.MaxMovesPerHour}}
{{- end}}
{{- if .PresenceGrace}}
  presence_grace: {{.PresenceGrace}}
{{- end}}
{{- if .ArbiterTick}}
  tick_every: {{.ArbiterTick}}
{{- end}}
{{- end}}
`,
}

// busAuthTemplate is the bus section's identity and TLS, appended to every
// service's bus.url: the service's own nkey and the lab CA when the stack
// runs with credentials, or insecure_lab when it runs a plain bus.
const busAuthTemplate = `
{{- if .BusSeed}}
  nkey_seed: {{.BusSeed}}
  tls:
    ca: {{.BusCA}}
{{- if .BusCert}}
    cert: {{.BusCert}}
    key: {{.BusKey}}
{{- end}}
{{- else}}
  insecure_lab: true
{{- end}}`
