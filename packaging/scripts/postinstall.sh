#!/bin/sh
# vipd post-installation: deb postinst (configure [old-version]) and rpm %post
# (1 = install, 2 = upgrade).
#
# vipd is enabled, so it starts at boot, but it is only started now when
# /etc/vipd/vipd.env sets VIPD_ADDRESS: a fresh install has nothing to run
# (and vipd.service would stop at once with exit status 2, which systemd does
# not retry). On upgrade only a running vipd is restarted onto the new binary
# (try-restart: a stopped vipd stays stopped); if it held the VIP, another
# node takes over within a second, and a restarted node never takes it back,
# so upgrading the holder last moves the VIP once (docs/install.md). The
# configuration file is a conffile / %config(noreplace): a changed one is
# kept.
set -e

case "$1" in
configure) if [ -n "$2" ]; then upgrade=1; else upgrade=0; fi ;;
1) upgrade=0 ;;
2) upgrade=1 ;;
*) exit 0 ;; # abort-upgrade, abort-remove, abort-deconfigure: nothing to undo
esac

configured() {
	grep -Eq '^[[:space:]]*(export[[:space:]]+)?VIPD_ADDRESS=[[:space:]]*["'\'']?[0-9A-Fa-f:.]' /etc/vipd/vipd.env 2>/dev/null
}

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
if [ "$upgrade" = 0 ]; then
	# Works without a running systemd too (it only creates the symlink).
	systemctl enable vipd.service >/dev/null 2>&1 || true
fi
if [ -d /run/systemd/system ] && configured; then
	if [ "$upgrade" = 1 ]; then
		systemctl try-restart vipd.service || true
	else
		systemctl start vipd.service || true
	fi
elif [ "$upgrade" = 0 ]; then
	echo "vipd: set VIPD_ADDRESS in /etc/vipd/vipd.env, then: vipd check-config && systemctl start vipd"
fi
exit 0
