#!/bin/bash
cat > /app/workerctl.sh <<'SH'
#!/bin/bash
# workerctl.sh start|stop|status - manage /app/worker.py with a PID file.
PIDFILE=/app/run/worker.pid
LOGFILE=/app/logs/worker.log

# Prints the worker's PID and returns 0 when the PID file points at a live worker.
live_pid() {
    [ -f "$PIDFILE" ] || return 1
    local pid
    pid=$(tr -dc '0-9' < "$PIDFILE")
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    local state
    state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null)
    [ "$state" != "Z" ] || return 1
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q '/app/worker.py' || return 1
    echo "$pid"
}

case "$1" in
    start)
        if pid=$(live_pid); then
            echo "already running (pid $pid)"
            exit 0
        fi
        mkdir -p /app/logs /app/run
        nohup python3 /app/worker.py >> "$LOGFILE" 2>&1 < /dev/null &
        pid=$!
        echo "$pid" > "$PIDFILE"
        echo "started (pid $pid)"
        ;;
    status)
        if pid=$(live_pid); then
            echo "running (pid $pid)"
            exit 0
        fi
        rm -f "$PIDFILE"
        echo "stopped"
        exit 3
        ;;
    stop)
        if ! pid=$(live_pid); then
            rm -f "$PIDFILE"
            echo "not running"
            exit 0
        fi
        kill -TERM "$pid"
        for _ in $(seq 1 100); do
            live_pid > /dev/null || break
            sleep 0.1
        done
        if live_pid > /dev/null; then
            kill -KILL "$pid"
            sleep 0.2
        fi
        rm -f "$PIDFILE"
        echo "stopped"
        ;;
    *)
        echo "usage: $0 start|stop|status" >&2
        exit 2
        ;;
esac
SH
chmod +x /app/workerctl.sh
bash /app/workerctl.sh start
bash /app/workerctl.sh status
bash /app/workerctl.sh stop
