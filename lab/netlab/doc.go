// Package netlab builds throwaway layer-2 labs out of Linux network namespaces for fan's
// end-to-end tests, the `make lab` demo and the failover benchmark.
//
// A lab is a set of namespaces that share one prefix ("fan" + 4 hex digits): one namespace
// per host (nodes, a client "c" and a control host "ctl"), each with a veth "eth0", and a
// separate "<prefix>-lan" namespace that holds the bridge and the bridge-side ends of the
// veths. Nothing is ever created in, or changed in, the root namespace, so deleting the
// lab's namespaces removes every interface it made. Only documentation addresses
// (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) are used, and no routes are added, so a
// lab cannot send anything beyond its own bridge.
//
// Close tears everything down (processes, namespaces, temp dir) and is idempotent and safe
// to call from a signal-handling goroutine. A crashed owner cannot call Close; it leaves a
// marker in /run/fan-netlab naming its pid, and Sweep (also run by every Build) removes the
// labs whose owner is gone.
//
// Everything here needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the ip(8) tool.
package netlab
