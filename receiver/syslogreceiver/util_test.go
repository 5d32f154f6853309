package syslogreceiver

import "os"

func filepathTemp() (string, error) { return os.MkdirTemp("", "fsl") }
func removeAll(d string)            { os.RemoveAll(d) }
