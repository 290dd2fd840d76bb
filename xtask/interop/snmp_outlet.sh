#!/bin/sh
# net-snmp "pass" script simulating PDU outlets: one INTEGER per plug under the base OID,
# kept in files under ./state beside this script. Used by `cargo xtask interop`.
dir=$(dirname "$0")/state
base=.1.3.6.1.4.1.13742.6.4.1.2.1.2.1
mkdir -p "$dir"
case "$1" in
  -g) plug=${2#$base.}
      [ "$plug" = "$2" ] && exit 0
      echo "$2"; echo integer; cat "$dir/$plug" 2>/dev/null || echo 0 ;;
  -s) plug=${2#$base.}
      [ "$3" = integer ] || { echo wrong-type; exit 0; }
      case "$4" in 0|1) echo "$4" > "$dir/$plug" ;; *) echo wrong-value ;; esac ;;
  *) exit 0 ;;
esac
