using System;
using System.IO;
using System.Runtime.InteropServices;
using UnityEngine;

namespace Oam.Bridge.Unity
{
    /// <summary>The command that starts the bridge: the file, its arguments and its working directory.</summary>
    public sealed class OamBridgeCommand
    {
        public OamBridgeCommand(string executable, string arguments, string workingDirectory, string source)
        {
            Executable = executable;
            Arguments = arguments ?? "";
            WorkingDirectory = workingDirectory ?? "";
            Source = source;
        }

        public string Executable { get; }
        public string Arguments { get; }
        public string WorkingDirectory { get; }
        /// <summary>Where it came from: <c>custom</c>, <c>shipped</c>, <c>project</c> or <c>python</c>.</summary>
        public string Source { get; }

        public override string ToString() => Source + ": " + Executable + " " + Arguments;
    }

    /// <summary>
    /// Finds the shipped bridge (the PyInstaller one-folder build of <c>make dist</c>) by the
    /// convention <c>StreamingAssets/oam-bridge/&lt;platform&gt;/oam-bridge[.exe]</c>, where platform
    /// is <c>linux-x64</c>, <c>windows-x64</c>, <c>macos-arm64</c>, ... (<see cref="PlatformFolder"/>).
    /// In the editor it also looks in the project's <c>OamBridge/&lt;platform&gt;/</c> folder (beside
    /// <c>Assets</c>; the build step copies from there), and then falls back to <c>python -m bridge</c>.
    /// </summary>
    public static class OamBridgeLocation
    {
        /// <summary>The folder under StreamingAssets (and the file name of the executable, without .exe).</summary>
        public const string FolderName = "oam-bridge";
        /// <summary>The project folder (beside Assets) that holds one dist per platform for the build step.</summary>
        public const string ProjectDistFolder = "OamBridge";

        /// <summary>
        /// The platform folder for an OS (<c>windows</c>, <c>macos</c>, <c>linux</c>) and an architecture:
        /// <c>x64</c>, <c>arm64</c>, <c>x86</c>.
        /// </summary>
        public static string PlatformFolder(string os, Architecture architecture)
        {
            string arch;
            switch (architecture)
            {
                case Architecture.X64: arch = "x64"; break;
                case Architecture.Arm64: arch = "arm64"; break;
                case Architecture.X86: arch = "x86"; break;
                default: arch = architecture.ToString().ToLowerInvariant(); break;
            }
            return os + "-" + arch;
        }

        /// <summary>This process's platform folder, e.g. <c>linux-x64</c>; null where no bridge can run (mobile, web, consoles).</summary>
        public static string CurrentPlatformFolder()
        {
            string os = OsOf(Application.platform);
            return os == null ? null : PlatformFolder(os, RuntimeInformation.ProcessArchitecture);
        }

        /// <summary><c>windows</c>, <c>macos</c>, <c>linux</c>, or null for platforms that cannot start a process.</summary>
        public static string OsOf(RuntimePlatform platform)
        {
            switch (platform)
            {
                case RuntimePlatform.WindowsPlayer:
                case RuntimePlatform.WindowsEditor: return "windows";
                case RuntimePlatform.OSXPlayer:
                case RuntimePlatform.OSXEditor: return "macos";
                case RuntimePlatform.LinuxPlayer:
                case RuntimePlatform.LinuxEditor: return "linux";
                default: return null;
            }
        }

        /// <summary><c>oam-bridge.exe</c> in a <c>windows-*</c> folder, else <c>oam-bridge</c>.</summary>
        public static string ExecutableName(string platformFolder) =>
            platformFolder != null && platformFolder.StartsWith("windows", StringComparison.Ordinal)
                ? FolderName + ".exe" : FolderName;

        /// <summary><c>root/&lt;platform&gt;/oam-bridge[.exe]</c> if that file exists, else null.</summary>
        public static string FindIn(string root, string platformFolder)
        {
            if (string.IsNullOrEmpty(root) || platformFolder == null) return null;
            string path = Path.Combine(root, platformFolder, ExecutableName(platformFolder));
            return File.Exists(path) ? path : null;
        }

        /// <summary>Where the shipped bridge is expected in this build: <c>StreamingAssets/oam-bridge/&lt;platform&gt;/oam-bridge[.exe]</c>.</summary>
        public static string ShippedPath()
        {
            string platform = CurrentPlatformFolder() ?? "<unsupported platform " + Application.platform + ">";
            return Path.Combine(Application.streamingAssetsPath, FolderName, platform, ExecutableName(platform));
        }

        /// <summary>
        /// The command to start. <paramref name="executable"/> set: exactly that (a custom command).
        /// Otherwise the shipped bridge (StreamingAssets), then, in the editor only, the project's
        /// <c>OamBridge/&lt;platform&gt;</c> dist and finally <paramref name="editorPython"/>
        /// (<c>python</c> on Windows, else <c>python3</c>) <c>-m bridge</c>. <paramref name="arguments"/>
        /// are the bridge's own arguments (e.g. <c>--engine scripted</c>) in the last three cases.
        /// Throws <see cref="FileNotFoundException"/> in a player without a shipped bridge.
        /// </summary>
        public static OamBridgeCommand Resolve(string executable, string arguments, string workingDirectory,
            string editorPython = null)
        {
            if (!string.IsNullOrEmpty(executable))
                return new OamBridgeCommand(executable, arguments, workingDirectory, "custom");
            string platform = CurrentPlatformFolder();
            if (platform == null)
                throw new PlatformNotSupportedException("oam-bridge: " + Application.platform
                    + " cannot start a subprocess; the bridge runs on Windows, macOS and Linux desktops only");
            string shipped = FindIn(Path.Combine(Application.streamingAssetsPath, FolderName), platform);
            if (shipped != null)
                return new OamBridgeCommand(shipped, arguments, Path.GetDirectoryName(shipped), "shipped");
            if (!Application.isEditor)
                throw new FileNotFoundException("oam-bridge: the shipped bridge is missing from this build (expected "
                    + ShippedPath() + "); put `make dist`'s dist/oam-bridge folder in the project's " + ProjectDistFolder
                    + "/" + platform + " folder and build again (README: Shipping your game)", ShippedPath());
            string project = Path.GetDirectoryName(Application.dataPath.TrimEnd('/', '\\'));
            string dist = FindIn(Path.Combine(project ?? "", ProjectDistFolder), platform);
            if (dist != null)
                return new OamBridgeCommand(dist, arguments, Path.GetDirectoryName(dist), "project");
            string python = string.IsNullOrEmpty(editorPython)
                ? (platform.StartsWith("windows", StringComparison.Ordinal) ? "python" : "python3") : editorPython;
            string args = "-m bridge" + (string.IsNullOrEmpty(arguments) ? "" : " " + arguments);
            return new OamBridgeCommand(python, args, workingDirectory, "python");
        }
    }
}
