#!/usr/bin/env bash
# The members' servers' network: a Docker bridge of its own, and the firewall rules that make
# the hub the only way in and out (docs/explanation/security.md, "The members' network").
#
#   gpuhub-network.sh create   make the Docker network (bridge options: no traffic between
#                              containers; servers' addresses from the upper half of the subnet)
#   gpuhub-network.sh rules    install (or refresh) the iptables rules for its bridge
#   gpuhub-network.sh unrule   remove the rules
#   gpuhub-network.sh remove   remove the rules and the network
#   gpuhub-network.sh show     print the rules
#
# Run as root on the Docker host, `create` once and `rules` at every boot after Docker
# (deploy/network/gpuhub-network.service). Each setting is an option or a variable:
#   --name NAME          GPUHUB_NETWORK            gpuhub: the Docker network (docker-compose.yml)
#   --subnet A.B.C.D/N   GPUHUB_NETWORK_SUBNET     172.31.255.0/24 (N from 16 to 28)
#   --bridge IFACE       GPUHUB_NETWORK_BRIDGE     gh-<name>, at most 15 characters
#   --hub-address IP     GPUHUB_HUB_ADDRESS        the subnet's second address (.2): the hub's
#                                                  and proxy's (compose's `pod`; a hub on the
#                                                  host itself, as the demo's: the gateway, .1)
#   --hub-ports LIST     GPUHUB_NETWORK_HUB_PORTS  8081,8000: the hub API and the proxy
#   --outbound WHAT      GPUHUB_NETWORK_OUTBOUND   all | none | CIDR[,CIDR...]: where servers
#                                                  may connect outside the bridge
# The rules, for traffic on the bridge (IPv4; IPv6 on it is refused outright):
#   - the hub address reaches every server on every port, and goes anywhere;
#   - a server reaches the hub address on the hub ports only: not another server, not a
#     service of the host (on the gateway address or any other of the host's addresses);
#   - a server reaches outside the bridge what --outbound allows;
#   - from outside the bridge, only the hub address is reached (the published proxy).
# Replies to allowed connections pass. The forwarding rules sit in DOCKER-USER, which Docker
# runs before its own rules (made here when Docker does not manage iptables), the host's in
# INPUT; each set is applied at once (iptables-restore), so a refresh never opens a gap.
set -euo pipefail

NAME="${GPUHUB_NETWORK:-gpuhub}"
SUBNET="${GPUHUB_NETWORK_SUBNET:-172.31.255.0/24}"
BRIDGE="${GPUHUB_NETWORK_BRIDGE:-}"
HUB="${GPUHUB_HUB_ADDRESS:-}"
PORTS="${GPUHUB_NETWORK_HUB_PORTS:-8081,8000}"
OUTBOUND="${GPUHUB_NETWORK_OUTBOUND:-all}"

die() { echo "gpuhub-network: $*" >&2; exit 1; }
usage() { sed -n '2,32p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }

[ "$#" -gt 0 ] || usage
command=$1; shift
while [ "$#" -gt 0 ]; do
  case $1 in
    --name) NAME=${2:?}; shift 2 ;;
    --subnet) SUBNET=${2:?}; shift 2 ;;
    --bridge) BRIDGE=${2:?}; shift 2 ;;
    --hub-address) HUB=${2:?}; shift 2 ;;
    --hub-ports) PORTS=${2:?}; shift 2 ;;
    --outbound) OUTBOUND=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done

ip2int() {
  local a b c d
  IFS=. read -r a b c d <<<"$1"
  echo $(( (a << 24) | (b << 16) | (c << 8) | d ))
}
int2ip() { echo "$(( $1 >> 24 & 255 )).$(( $1 >> 16 & 255 )).$(( $1 >> 8 & 255 )).$(( $1 & 255 ))"; }
is_ip() { [[ $1 =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]]; }

[[ $NAME =~ ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$ ]] || die "--name $NAME: not a Docker network name"
[[ $SUBNET =~ ^([0-9.]+)/([0-9]+)$ ]] || die "--subnet $SUBNET: write it as A.B.C.D/N"
base_ip=${BASH_REMATCH[1]}; prefix=${BASH_REMATCH[2]}
is_ip "$base_ip" && [ "$prefix" -ge 16 ] && [ "$prefix" -le 28 ] \
  || die "--subnet $SUBNET: an IPv4 network from /16 to /28"
mask=$(( (0xffffffff << (32 - prefix)) & 0xffffffff ))
net=$(( $(ip2int "$base_ip") & mask ))
SUBNET="$(int2ip "$net")/$prefix"
GATEWAY=$(int2ip $(( net + 1 )))
# servers take addresses from the upper half only: the lower one holds the gateway and the hub
IP_RANGE="$(int2ip $(( net + (1 << (31 - prefix)) )))/$(( prefix + 1 ))"
HUB=${HUB:-$(int2ip $(( net + 2 )))}
is_ip "$HUB" && [ $(( $(ip2int "$HUB") & mask )) -eq "$net" ] \
  || die "--hub-address $HUB is not in $SUBNET"
BRIDGE=${BRIDGE:-gh-${NAME:0:12}}
[ "${#BRIDGE}" -le 15 ] || die "--bridge $BRIDGE: at most 15 characters"
[[ $PORTS =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--hub-ports $PORTS: ports separated by commas"
# chain names: at most 28 characters
CHAIN="GPUHUB-${BRIDGE}"
FWD="${CHAIN}-F"
IN="${CHAIN}-I"

network_exists() { docker network inspect "$NAME" >/dev/null 2>&1; }

create() {
  if network_exists; then
    echo "gpuhub-network: $NAME exists already ($(docker network inspect -f \
      '{{range .IPAM.Config}}{{.Subnet}}{{end}} on {{index .Options "com.docker.network.bridge.name"}}' "$NAME"))"
    return
  fi
  docker network create --driver bridge --subnet "$SUBNET" --gateway "$GATEWAY" \
    --ip-range "$IP_RANGE" \
    --opt "com.docker.network.bridge.name=$BRIDGE" \
    --opt com.docker.network.bridge.enable_icc=false \
    --label io.gpuhub.network=members "$NAME" >/dev/null
  echo "gpuhub-network: made $NAME ($SUBNET on $BRIDGE; servers from $IP_RANGE; hub $HUB)"
}

# the rules of one table, for iptables-restore --noflush: declaring a chain creates or
# empties it, and the whole table is committed at once
ipv4_rules() {
  local dports="-m multiport --dports $PORTS"
  cat <<EOF
*filter
:$FWD - [0:0]
:$IN - [0:0]
-A $FWD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A $FWD -m conntrack --ctstate INVALID -j DROP
-A $FWD -i $BRIDGE -o $BRIDGE -s $HUB -j ACCEPT
-A $FWD -i $BRIDGE -o $BRIDGE -d $HUB -p tcp $dports -j ACCEPT
-A $FWD -i $BRIDGE -o $BRIDGE -j REJECT --reject-with icmp-port-unreachable
-A $FWD -i $BRIDGE -s $HUB -j RETURN
EOF
  case $OUTBOUND in
    all) echo "-A $FWD -i $BRIDGE -j RETURN" ;;
    none) ;;
    *)
      local cidr
      for cidr in ${OUTBOUND//,/ }; do echo "-A $FWD -i $BRIDGE -d $cidr -j RETURN"; done ;;
  esac
  cat <<EOF
-A $FWD -i $BRIDGE -j REJECT --reject-with icmp-port-unreachable
-A $FWD -o $BRIDGE -d $HUB -j RETURN
-A $FWD -o $BRIDGE -j REJECT --reject-with icmp-port-unreachable
-A $IN -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A $IN -s $HUB -j RETURN
-A $IN -d $HUB -p tcp $dports -j ACCEPT
-A $IN -p tcp -j REJECT --reject-with tcp-reset
-A $IN -j REJECT --reject-with icmp-port-unreachable
COMMIT
EOF
}

ipv6_rules() {
  cat <<EOF
*filter
:$FWD - [0:0]
:$IN - [0:0]
-A $FWD -j REJECT
-A $IN -j REJECT
COMMIT
EOF
}

# a jump to our chain at the top of a built-in (or DOCKER-USER) chain, once
jump() {
  local tool=$1 from=$2 match=$3 to=$4
  # shellcheck disable=SC2086
  $tool -w -C "$from" $match -j "$to" 2>/dev/null || $tool -w -I "$from" 1 $match -j "$to"
}

unjump() {
  local tool=$1 from=$2 match=$3 to=$4
  # shellcheck disable=SC2086
  while $tool -w -C "$from" $match -j "$to" 2>/dev/null; do $tool -w -D "$from" $match -j "$to"; done
}

forward_chain() {
  # Docker runs DOCKER-USER before its own forwarding rules and leaves an existing one as it
  # is; without Docker's iptables (or before Docker starts) it is made here
  local tool=$1
  if ! $tool -w -n -L DOCKER-USER >/dev/null 2>&1; then
    $tool -w -N DOCKER-USER
    $tool -w -A DOCKER-USER -j RETURN
  fi
  $tool -w -C FORWARD -j DOCKER-USER 2>/dev/null || $tool -w -I FORWARD 1 -j DOCKER-USER
}

rules() {
  command -v iptables >/dev/null || die "iptables is not installed (apt-get install iptables)"
  ipv4_rules | iptables-restore -w --noflush
  forward_chain iptables
  jump iptables DOCKER-USER "-i $BRIDGE" "$FWD"
  jump iptables DOCKER-USER "-o $BRIDGE" "$FWD"
  jump iptables INPUT "-i $BRIDGE" "$IN"
  if command -v ip6tables >/dev/null && ip6tables -w -n -L >/dev/null 2>&1; then
    ipv6_rules | ip6tables-restore -w --noflush
    forward_chain ip6tables
    jump ip6tables DOCKER-USER "-i $BRIDGE" "$FWD"
    jump ip6tables DOCKER-USER "-o $BRIDGE" "$FWD"
    jump ip6tables INPUT "-i $BRIDGE" "$IN"
  fi
  echo "gpuhub-network: rules for $BRIDGE: hub $HUB (ports $PORTS), outbound $OUTBOUND"
}

unrule() {
  local tool
  for tool in iptables ip6tables; do
    command -v "$tool" >/dev/null && $tool -w -n -L >/dev/null 2>&1 || continue
    unjump "$tool" DOCKER-USER "-i $BRIDGE" "$FWD"
    unjump "$tool" DOCKER-USER "-o $BRIDGE" "$FWD"
    unjump "$tool" INPUT "-i $BRIDGE" "$IN"
    for chain in "$FWD" "$IN"; do
      if $tool -w -n -L "$chain" >/dev/null 2>&1; then
        $tool -w -F "$chain"
        $tool -w -X "$chain"
      fi
    done
  done
}

show() {
  iptables -w -S "$FWD" 2>/dev/null || echo "no rules for $BRIDGE (run: $0 rules)"
  iptables -w -S "$IN" 2>/dev/null || true
}

case $command in
  create) create ;;
  rules) rules ;;
  unrule) unrule ;;
  remove)
    unrule
    if network_exists; then docker network rm "$NAME" >/dev/null; fi
    echo "gpuhub-network: removed $NAME and its rules" ;;
  show) show ;;
  *) usage ;;
esac
