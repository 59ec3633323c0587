#!/bin/sh
# vipd pre-removal: deb prerm (remove | upgrade | deconfigure | failed-upgrade)
# and rpm %preun (0 = erase, 1 = upgrade).
#
# On removal vipd is stopped: on SIGTERM it releases the VIP, leaves the
# gossip cluster and withdraws its BGP routes, so another node takes over.
# On upgrade nothing is stopped here; the new package restarts vipd.
set -e

case "$1" in
remove | deconfigure | 0)
	if [ -d /run/systemd/system ]; then
		systemctl stop vipd.service || true
	fi
	systemctl disable vipd.service >/dev/null 2>&1 || true
	;;
esac
exit 0
