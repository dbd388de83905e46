#!/bin/sh
# disque-entrypoint: start a Disque node from a config file and/or environment
# variables, in the foreground, as the process itself (exec), so that signals
# reach it: SIGTERM is a graceful shutdown (exit 0).
#
#   disque-entrypoint [--directive value ...]   start the node (extra directives win)
#   disque-entrypoint disque-server [conf] [--directive value ...]   the same
#   disque-entrypoint healthcheck               exit 0 if the local node answers PING
#                                               (docker's HEALTHCHECK; Kubernetes
#                                               probes the node's /healthz instead)
#   disque-entrypoint ready                     exit 0 if it answers PING and, with
#                                               DISQUE_JOIN, has a reachable peer
#   disque-entrypoint print-command [...]       print the server command line, one
#                                               argument per line, and exit
#   disque-entrypoint --print-config [...]      print the configuration the node
#                                               would run with (disque.conf format)
#   disque-entrypoint --version | --help        disque-server's
#   disque-entrypoint COMMAND [ARG ...]         run any other command (disque, sh, ...)
#
# Configuration, later sources winning:
#   1. the config file: $DISQUE_CONFIG_FILE, else /etc/disque/disque.conf if it
#      exists (DISQUE_CONFIG_FILE=none: no config file);
#   2. container defaults, only for directives the config file does not set:
#      bind 0.0.0.0, dir $DISQUE_DATA_DIR (default /data, created if missing);
#   3. DISQUE_<DIRECTIVE> variables: DISQUE_PORT=7711 -> --port 7711,
#      DISQUE_MAXMEMORY_POLICY=acks -> --maxmemory-policy acks (empty = unset);
#   4. arguments given to the entrypoint.
# daemonize is always "no": the node must stay in the foreground.
#
# Peers: the node's own cluster-discovery directive (DISQUE_CLUSTER_DISCOVERY=
# name:port) meets every address a DNS name resolves to, again and again; it
# is what Kubernetes and compose use. Where that does not fit,
# DISQUE_JOIN=host:port[@bus-port],...: once the node answers PING, a background loop
# sends CLUSTER MEET <ip> <port> for each peer (names are resolved first),
# retrying unreachable ones (DISQUE_JOIN_RETRIES times, every
# DISQUE_JOIN_INTERVAL seconds). Meeting one member is enough: the node learns
# the rest of the cluster by gossip. A peer's answer is logged.
#
# DISQUE_ANNOUNCE_FILE=path: lines "NAME ADDRESS CLIENT-PORT BUS-PORT" (# starts
# a comment); the line whose NAME is $DISQUE_NODE_NAME (default: the host name)
# gives cluster-announce-ip, -port and -bus-port, unless the
# DISQUE_CLUSTER_ANNOUNCE_* variables are set. No such line: the node does not
# start. deploy/kubernetes/external/ uses it, one line per pod.
#
# DISQUE_REQUIRE_CLUSTER_SECRET=yes: refuse to start without a cluster-secret
# (from DISQUE_CLUSTER_SECRET, the config file or the arguments; an empty one
# counts as none), so that a missing secret is a failed start, not a node
# whose bus takes unsigned messages.
#
# Runs outside a container too (that is how it is tested): every path comes
# from the variables above, and disque-server / disque are looked up in PATH.
set -eu

# DISQUE_<NAME> variables turn into --<name> for these directives: the names of
# DIRECTIVES in disque/config.py (tests/docker checks that the lists match;
# their order is the order of the arguments, which does not matter).
DIRECTIVES="
port bind dir logfile loglevel daemonize pidfile requirepass hz timeout
tcp-keepalive tcp-backlog maxclients maxmemory maxmemory-policy
proto-max-bulk-len client-query-buffer-limit client-output-buffer-limit auth-timeout
max-queue-name-len max-queues-per-command enable-protected-configs appendonly
appendfilename appendfsync aof-enqueue-jobs-once aof-load-truncated
auto-aof-rewrite-percentage auto-aof-rewrite-min-size shutdown-timeout idmp-max-keys
cluster-config-file
cluster-node-timeout cluster-secret metrics-port metrics-bind tls-port
tls-cert-file tls-key-file tls-ca-cert-file tls-auth-clients aclfile tls-cluster
cluster-max-inbound-links cluster-announce-ip cluster-announce-port
cluster-announce-bus-port cluster-discovery cluster-discovery-interval
cluster-discovery-forget-time max-job-headers max-job-headers-size max-group-key-len
"

# DISQUE_* variables that are settings of this script (or of the disque CLI),
# not directives.
OWN_VARS="
DISQUE_CONFIG_FILE DISQUE_DATA_DIR DISQUE_JOIN DISQUE_JOIN_RETRIES
DISQUE_JOIN_INTERVAL DISQUE_LOCAL_HOST DISQUE_PASSWORD DISQUE_HISTFILE
DISQUE_ANNOUNCE_FILE DISQUE_NODE_NAME DISQUE_REQUIRE_CLUSTER_SECRET
"

DEFAULT_CONFIG_FILE=/etc/disque/disque.conf

log() {
    printf 'disque-entrypoint: %s\n' "$*" >&2
}

die() {
    log "error: $*"
    exit 1
}

# DISQUE_ variable name of a directive: maxmemory-policy -> DISQUE_MAXMEMORY_POLICY
var_name() {
    printf 'DISQUE_%s' "$1" | tr 'abcdefghijklmnopqrstuvwxyz-' 'ABCDEFGHIJKLMNOPQRSTUVWXYZ_'
}

# The config file to use, or nothing.
find_config() {
    case "${DISQUE_CONFIG_FILE:-}" in
        none) ;;
        "")
            if [ -f "$DEFAULT_CONFIG_FILE" ]; then
                printf '%s' "$DEFAULT_CONFIG_FILE"
            fi
            ;;
        *)
            [ -f "$DISQUE_CONFIG_FILE" ] || die "DISQUE_CONFIG_FILE=$DISQUE_CONFIG_FILE: no such file"
            printf '%s' "$DISQUE_CONFIG_FILE"
            ;;
    esac
}

# Does the config file ($config) set directive $1?
conf_has() {
    [ -n "$config" ] || return 1
    awk -v name="$1" '
        { sub(/\r$/, ""); sub(/^[ \t]+/, "") }
        /^#/ || NF < 2 { next }
        tolower($1) == name { found = 1 }
        END { exit !found }' "$config"
}

# The value the config file ($config) gives directive $1 (the last one),
# without surrounding quotes; empty if none.
conf_value() {
    [ -n "$config" ] || return 0
    awk -v name="$1" '
        { sub(/\r$/, ""); sub(/^[ \t]+/, "") }
        /^#/ || NF < 2 { next }
        tolower($1) == name { sub(/^[^ \t]+[ \t]+/, ""); sub(/[ \t]+$/, ""); value = $0 }
        END {
            if (value ~ /^".*"$/ || value ~ /^\047.*\047$/) value = substr(value, 2, length(value) - 2)
            print value
        }' "$config"
}

# Run the disque CLI against the local node ($local_port, $local_pass); the
# password goes through the environment, not the command line.
local_cli() {
    if [ -n "$local_pass" ]; then
        DISQUE_PASSWORD=$local_pass disque -h "${DISQUE_LOCAL_HOST:-127.0.0.1}" -p "$local_port" "$@"
    else
        disque -h "${DISQUE_LOCAL_HOST:-127.0.0.1}" -p "$local_port" "$@"
    fi
}

# An IP address for host $1 (CLUSTER MEET takes addresses, not names).
resolve() {
    case $1 in
        *:*) printf '%s\n' "$1"; return 0 ;;                     # IPv6 literal
        *[!0-9.]*) ;;                                           # a name
        *) printf '%s\n' "$1"; return 0 ;;                      # IPv4 literal
    esac
    addr=""
    if command -v getent >/dev/null 2>&1; then
        addr=$(getent ahostsv4 "$1" 2>/dev/null | awk 'NR == 1 { print $1 }')
        [ -n "$addr" ] || addr=$(getent ahosts "$1" 2>/dev/null | awk 'NR == 1 { print $1 }')
    else
        addr=$(python3 -c 'import socket, sys; print(socket.getaddrinfo(sys.argv[1], None)[0][4][0])' \
            "$1" 2>/dev/null) || addr=""
    fi
    [ -n "$addr" ] || return 1
    printf '%s\n' "$addr"
}

# CLUSTER MEET one peer. Returns 0 when done with it (met, or an answer that
# retrying cannot change), 1 to try again later.
join_one() {
    peer=$1
    # host:port, or host:port@bus-port (a bus not at port + 10000: a NodePort's)
    peer_bus=""
    case $peer in
        *@*) peer_bus=${peer##*@}; peer=${peer%@*} ;;
    esac
    case $peer in
        *:*) peer_host=${peer%:*}; peer_port=${peer##*:} ;;
        *) log "join: ignoring '$peer': expected host:port"; return 0 ;;
    esac
    peer_host=${peer_host#\[}
    peer_host=${peer_host%\]}
    case $peer_port:$peer_bus in
        :* | *[!0-9:]*) log "join: ignoring '$peer': bad port"; return 0 ;;
    esac
    if ! ip=$(resolve "$peer_host"); then
        log "join: cannot resolve $peer_host yet, will retry"
        return 1
    fi
    # shellcheck disable=SC2086  # $peer_bus: the optional third argument
    if reply=$(local_cli cluster meet "$ip" "$peer_port" $peer_bus 2>&1); then
        log "join: CLUSTER MEET $ip $peer_port $peer_bus($peer): $reply"
        return 0
    fi
    case $reply in
        "Could not connect"* | *"Connection"* | LOADING*)
            log "join: CLUSTER MEET $peer: $reply; will retry"
            return 1
            ;;
        *)
            log "join: CLUSTER MEET $ip $peer_port ($peer) failed: $reply"
            return 0
            ;;
    esac
}

# The background join loop; $1 is the node's pid (this script's, after exec).
join_cluster() {
    set +e
    server_pid=$1
    retries=${DISQUE_JOIN_RETRIES:-30}
    interval=${DISQUE_JOIN_INTERVAL:-2}
    tries=0
    until [ "$(local_cli ping 2>/dev/null)" = PONG ]; do
        tries=$((tries + 1))
        kill -0 "$server_pid" 2>/dev/null || return 0
        if [ "$tries" -ge "$retries" ]; then
            log "join: the node did not answer PING on port $local_port after $tries tries; not joining"
            return 0
        fi
        sleep "$interval"
    done
    pending=$(printf '%s' "$DISQUE_JOIN" | tr ',' ' ')
    tries=0
    while :; do
        tries=$((tries + 1))
        again=""
        for peer in $pending; do
            join_one "$peer" || again="$again $peer"
        done
        pending=$again
        [ -n "$pending" ] || return 0
        if [ "$tries" -ge "$retries" ]; then
            log "join: giving up on$pending after $tries tries"
            return 0
        fi
        kill -0 "$server_pid" 2>/dev/null || return 0
        sleep "$interval"
    done
}

healthcheck() {
    config=$(find_config)
    local_port=${DISQUE_PORT:-$(conf_value port)}
    local_port=${local_port:-7711}
    local_pass=${DISQUE_PASSWORD:-${DISQUE_REQUIREPASS:-$(conf_value requirepass)}}
    if [ "$local_port" = 0 ]; then
        echo "port 0: set DISQUE_PORT to the node's port for the health check"
        return 1
    fi
    # The node answers PING before AUTH, so a check that does not know the
    # password still gets PONG from a live node. One PING over a socket, by
    # Python without its site packages (isolated, -I -S): 15 ms of CPU,
    # where the disque CLI takes 130 ms (docker/README.md, "Health check").
    # shellcheck disable=SC2016
    python3 -I -S -c '
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    with socket.create_connection((host, port), timeout=4) as sock:
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        reply = sock.recv(256)
except OSError as err:
    print(f"Could not connect to {host}:{port}: {err.strerror or err}")
    sys.exit(1)
print(reply.decode("utf-8", "replace").strip().lstrip("+-") or "no reply")
sys.exit(0 if reply.startswith(b"+PONG") else 1)' "${DISQUE_LOCAL_HOST:-127.0.0.1}" "$local_port"
}

# Readiness (Kubernetes): answers PING and, when DISQUE_JOIN names peers,
# has joined (at least one reachable peer; CLUSTER INFO).
ready() {
    healthcheck >/dev/null || { echo "not answering PING on port $local_port"; return 1; }
    if [ -z "${DISQUE_JOIN:-}" ]; then
        echo ready
        return 0
    fi
    reachable=$(local_cli cluster info 2>/dev/null | tr -d '\r' |
        sed -n 's/^cluster_reachable_nodes:\([0-9][0-9]*\)$/\1/p')
    if [ "${reachable:-0}" -ge 1 ]; then
        echo "ready: joined, $reachable reachable peers"
        return 0
    fi
    echo "not ready: no reachable peer yet (DISQUE_JOIN=$DISQUE_JOIN)"
    return 1
}

# ---------------------------------------------------------------------------

dry_run=""
case "${1:-}" in
    healthcheck)
        healthcheck
        exit $?
        ;;
    ready)
        ready
        exit $?
        ;;
    print-command) dry_run=1; shift ;;
esac
case "${1:-}" in
    disque-server) shift ;;
    "" | -*) ;;
    *) [ -n "$dry_run" ] || exec "$@" ;;
esac
# disque-server's own options: --version and --help as they are; --print-config
# shows the configuration the variables and the file make, without starting.
print_config=""
case "${1:-}" in
    -v | --version | -h | --help) [ -n "$dry_run" ] || exec disque-server "$1" ;;
    --print-config) print_config=1; shift ;;
esac

config=$(find_config)
if [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then
    config=$1    # disque-server /path/to/disque.conf [...]
    shift
fi

# Container defaults, for what the config file leaves out.
if ! conf_has bind; then
    : "${DISQUE_BIND:=0.0.0.0}"
fi
if ! conf_has dir; then
    : "${DISQUE_DIR:=${DISQUE_DATA_DIR:-/data}}"
fi
if [ -n "${DISQUE_DIR:-}" ] && [ -z "$dry_run$print_config" ]; then
    mkdir -p "$DISQUE_DIR" 2>/dev/null || die "cannot create the data directory $DISQUE_DIR"
    [ -w "$DISQUE_DIR" ] || die "the data directory $DISQUE_DIR is not writable by uid $(id -u):" \
        "chown it (the image's user is uid 10001) or use a named volume"
fi

# This node's announced address, from its line of DISQUE_ANNOUNCE_FILE.
if [ -n "${DISQUE_ANNOUNCE_FILE:-}" ]; then
    [ -f "$DISQUE_ANNOUNCE_FILE" ] || die "DISQUE_ANNOUNCE_FILE=$DISQUE_ANNOUNCE_FILE: no such file"
    node_name=${DISQUE_NODE_NAME:-$(uname -n)}
    announced=$(awk -v name="$node_name" '
        { sub(/\r$/, "") }
        /^[ \t]*#/ || NF == 0 { next }
        $1 == name { print $2, $3, $4, NF; exit }' "$DISQUE_ANNOUNCE_FILE")
    [ -n "$announced" ] || die "no line for $node_name in $DISQUE_ANNOUNCE_FILE:" \
        "add one (NAME ADDRESS CLIENT-PORT BUS-PORT) for every replica"
    read -r announce_ip announce_port announce_bus_port fields <<EOF
$announced
EOF
    case "$fields $announce_port $announce_bus_port" in
        "4 "[0-9]*" "[0-9]*) ;;
        *) die "$DISQUE_ANNOUNCE_FILE: expected '$node_name ADDRESS CLIENT-PORT BUS-PORT'" ;;
    esac
    case "$announce_port$announce_bus_port" in
        *[!0-9]*) die "$DISQUE_ANNOUNCE_FILE: $node_name's ports are not numbers" ;;
    esac
    : "${DISQUE_CLUSTER_ANNOUNCE_IP:=$announce_ip}"
    : "${DISQUE_CLUSTER_ANNOUNCE_PORT:=$announce_port}"
    : "${DISQUE_CLUSTER_ANNOUNCE_BUS_PORT:=$announce_bus_port}"
    log "announcing $DISQUE_CLUSTER_ANNOUNCE_IP:$DISQUE_CLUSTER_ANNOUNCE_PORT" \
        "(bus $DISQUE_CLUSTER_ANNOUNCE_BUS_PORT) for $node_name"
fi

# Unknown DISQUE_* variables are most likely typos: say so.
known=" "
for name in $OWN_VARS; do
    known="$known$name "
done
for directive in $DIRECTIVES; do
    known="$known$(var_name "$directive") "
done
for name in $(env | sed -n 's/^\(DISQUE_[A-Za-z0-9_]*\)=.*/\1/p'); do
    case $known in
        *" $name "*) ;;
        *) log "warning: $name is neither a directive nor a setting of this script: ignored" ;;
    esac
done

# The command line, built after the user's arguments, which are then moved to
# the end (they win): [config] [--directive value ...] [user arguments].
user_args=$#
if [ -n "$config" ]; then
    set -- "$@" "$config"
fi
for directive in $DIRECTIVES; do
    var=$(var_name "$directive")
    eval "value=\${$var:-}"
    [ -n "$value" ] || continue
    if [ "$directive" = daemonize ]; then
        log "warning: ignoring $var: the node runs in the foreground"
        continue
    fi
    set -- "$@" "--$directive" "$value"
done
set -- "$@" --daemonize no
i=0
while [ "$i" -lt "$user_args" ]; do
    set -- "$@" "$1"
    shift
    i=$((i + 1))
done

# Port, password and cluster secret the node will have (for the join loop
# and the check below), and the command as logged (secrets masked).
local_port=$(conf_value port)
local_pass=$(conf_value requirepass)
cluster_secret=$(conf_value cluster-secret)
shown=""
previous=""
for arg in "$@"; do
    case $previous in
        --port) local_port=$arg ;;
        --requirepass) local_pass=$arg; arg="(hidden)" ;;
        --cluster-secret) cluster_secret=$arg; arg="(hidden)" ;;
    esac
    shown="$shown $arg"
    previous=$arg
done
local_port=${local_port:-7711}

case "${DISQUE_REQUIRE_CLUSTER_SECRET:-no}" in
    yes | true | 1)
        [ -n "$cluster_secret" ] || die "no cluster-secret, and DISQUE_REQUIRE_CLUSTER_SECRET" \
            "is set: give it (DISQUE_CLUSTER_SECRET, the config file); refusing to start" ;;
    no | false | 0) ;;
    *) die "DISQUE_REQUIRE_CLUSTER_SECRET=$DISQUE_REQUIRE_CLUSTER_SECRET: expected yes or no" ;;
esac

if [ -n "$dry_run" ]; then
    printf '%s\n' disque-server "$@"
    exit 0
fi
if [ -n "$print_config" ]; then
    exec disque-server --print-config "$@"
fi

if [ -n "${DISQUE_JOIN:-}" ]; then
    if [ "$local_port" = 0 ]; then
        log "join: DISQUE_JOIN needs a fixed port (DISQUE_PORT is 0): not joining"
    else
        # A subshell that exits at once: the loop is orphaned (adopted by
        # init) instead of staying a child, then a zombie, of the node.
        (join_cluster "$$" &)
    fi
fi

log "starting: disque-server$shown"
exec disque-server "$@"
