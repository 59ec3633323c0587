#!/bin/sh
# vipd post-removal: deb postrm (remove | purge | upgrade | ...) and rpm
# %postun (0 = erase, 1 = upgrade).
#
# purge (deb only) deletes the state directory (the cluster members this node
# remembered) and the configuration directory; dpkg itself removes the
# conffile /etc/vipd/vipd.env. rpm keeps /var/lib/vipd on erase, like other
# state, and leaves a changed vipd.env as vipd.env.rpmsave.
set -e

case "$1" in
purge)
	rm -rf /var/lib/vipd
	rm -f /etc/vipd/vipd.env.dpkg-old /etc/vipd/vipd.env.dpkg-dist
	rmdir /etc/vipd 2>/dev/null || true
	;;
esac
case "$1" in
remove | purge | 0)
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload >/dev/null 2>&1 || true
	fi
	;;
esac
exit 0
