# tap_report.sh — sourced by the shell test harnesses (tests/netns/,
# tests/slurm/): TAP lines with a running count, and minigpt's parameter
# hash.
#
#   report OK NAME [FILE...]   "ok N - NAME" when OK is 1, else "not ok N -
#                              NAME" and the last 15 lines of each FILE
#   hash_of FILE               the hash minigpt --check-replicas printed last
# The counts are in $passed and $failed.
n=0 passed=0 failed=0

report() {
    local ok=$1 name=$2
    shift 2
    n=$((n + 1))
    if [ "$ok" = 1 ]; then
        echo "ok $n - $name"
        passed=$((passed + 1))
    else
        echo "not ok $n - $name"
        failed=$((failed + 1))
        for f in "$@"; do
            echo "# --- $(basename "$f")"
            tail -n 15 "$f" | sed 's/^/#   /'
        done
    fi
}

hash_of() {
    sed -n 's/.*bitwise identical parameters (hash \([0-9a-f]*\)).*/\1/p' "$1" | tail -n 1
}
