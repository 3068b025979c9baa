package sharing

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The built-in stand-in for nvidia-cuda-mps-control, used with fake GPUs
// (`tessera-node mps-standin`): tessera-node's image has no NVIDIA driver,
// and a fraction pod on a fake node must still get its MPS share prepared.
// It behaves as the control program does as far as tessera-node sees it:
// `-d` starts a daemon in its own session and writes its pid file in
// CUDA_MPS_PIPE_DIRECTORY; without -d it reads one command from stdin, and
// `quit` stops the daemon. It records what it was told in
// CUDA_MPS_LOG_DIRECTORY/control.log, and, for tests, in the file named by
// StandInRecordEnv ("start <uuid>", "quit <uuid>"; "<uuid> <pid>" in
// <file>.pids), as the tests' shell stand-in does.

// StandInRecordEnv names the file both stand-ins append their calls to.
const StandInRecordEnv = "TESSERA_MPS_RECORD"

// StandInCommand is the tessera-node subcommand of the stand-in.
const StandInCommand = "mps-standin"

// RunStandIn runs the stand-in with its arguments (after the subcommand)
// and returns its exit code.
func RunStandIn(args []string, stdin io.Reader, stderr io.Writer) int {
	if err := runStandIn(args, stdin); err != nil {
		fmt.Fprintf(stderr, "tessera-node %s: %v\n", StandInCommand, err)
		return 1
	}
	return 0
}

func runStandIn(args []string, stdin io.Reader) error {
	gpuUUID := os.Getenv("CUDA_VISIBLE_DEVICES")
	pipeDir, logDir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), os.Getenv("CUDA_MPS_LOG_DIRECTORY")
	switch {
	case len(args) == 1 && args[0] == "daemon":
		// The "daemon": it waits to be told to quit.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		return nil
	case pipeDir == "" || logDir == "" || gpuUUID == "":
		return fmt.Errorf("CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY and CUDA_VISIBLE_DEVICES must be set (got %q, %q, %q)", pipeDir, logDir, gpuUUID)
	case len(args) == 1 && args[0] == "-d":
		return standInStart(gpuUUID, pipeDir, logDir)
	case len(args) == 0:
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && line == "" {
			return fmt.Errorf("reading a command from stdin: %w", err)
		}
		cmd := strings.TrimSpace(line)
		if err := standInRecord(logDir, cmd+" "+gpuUUID); err != nil {
			return err
		}
		if cmd != "quit" {
			return nil
		}
		pid, err := readPID(filepath.Join(pipeDir, PIDFile))
		if err != nil {
			return nil // no daemon: nothing to quit
		}
		_ = syscall.Kill(pid, syscall.SIGTERM)
		return nil
	default:
		return fmt.Errorf("unknown arguments %q: want -d, daemon, or none (a command on stdin)", args)
	}
}

func standInStart(gpuUUID, pipeDir, logDir string) error {
	for _, dir := range []string{pipeDir, logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding tessera-node's executable: %w", err)
	}
	cmd := exec.Command(self, StandInCommand, "daemon")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the stand-in daemon: %w", err)
	}
	pid := cmd.Process.Pid
	if err := os.WriteFile(filepath.Join(pipeDir, PIDFile), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	if rec := os.Getenv(StandInRecordEnv); rec != "" {
		if err := appendLine(rec+".pids", gpuUUID+" "+strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return standInRecord(logDir, "start "+gpuUUID)
}

func standInRecord(logDir, line string) error {
	if err := appendLine(filepath.Join(logDir, "control.log"), time.Now().UTC().Format(time.RFC3339)+" tessera stand-in: "+line); err != nil {
		return err
	}
	if rec := os.Getenv(StandInRecordEnv); rec != "" {
		return appendLine(rec, line)
	}
	return nil
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
