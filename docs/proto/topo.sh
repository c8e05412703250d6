#!/bin/bash
set -e
ip netns add bwp-node; ip netns add bwp-remote
ip -n bwp-node link set lo up; ip -n bwp-node addr add 192.0.2.1/32 dev lo
ip -n bwp-remote link set lo up
ip -n bwp-node link add up0 type veth peer name eth0 netns bwp-remote
ip -n bwp-node addr add 198.51.100.1/24 dev up0 nodad; ip -n bwp-node link set up0 up
ip -n bwp-remote addr add 198.51.100.2/24 dev eth0 nodad; ip -n bwp-remote link set eth0 up
ip -n bwp-remote route add default via 198.51.100.1
