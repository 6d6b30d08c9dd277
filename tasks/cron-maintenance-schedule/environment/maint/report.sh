#!/bin/bash
# report job (placeholder)
echo "report done"
