@echo off
echo hello   
