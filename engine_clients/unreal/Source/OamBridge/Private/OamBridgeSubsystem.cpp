// OamBridgeSubsystem.cpp - the Unreal layer over the engine-agnostic core (Core/oam_client.h).
#include "OamBridgeSubsystem.h"

#include "Async/Async.h"
#include "HAL/PlatformMisc.h"
#include "HAL/PlatformProcess.h"
#include "Interfaces/IPluginManager.h"
#include "Misc/Paths.h"

#include <exception>
#include <string>
#include <vector>

#include "OamJson.h"
#include "oam_client.h"
#include "oam_process.h"

using OamJson::Dump;
using OamJson::Str;
using OamJson::ToFString;
using OamJson::ToStd;
using OamJson::ToStdList;

namespace
{
oam::json ParseJson(const FString& Text, oam::json Fallback)
{
	return OamJson::Parse(Text, std::move(Fallback));
}

// The shipped bridge's folder name for this platform (Build.cs stages the same folder).
const TCHAR* BridgePlatformDir()
{
#if PLATFORM_WINDOWS
	return TEXT("Win64");
#elif PLATFORM_MAC
	return TEXT("Mac");
#elif PLATFORM_LINUX && PLATFORM_CPU_ARM_FAMILY
	return TEXT("LinuxArm64");
#else
	return TEXT("Linux");
#endif
}

const TCHAR* BridgeExecutableName()
{
#if PLATFORM_WINDOWS
	return TEXT("oam-bridge.exe");
#else
	return TEXT("oam-bridge");
#endif
}
}  // namespace

UOamBridgeSubsystem::UOamBridgeSubsystem() = default;
// UHT's vtable constructor: defined here, where TUniquePtr<oam::Client> can be destroyed.
UOamBridgeSubsystem::UOamBridgeSubsystem(FVTableHelper& Helper) : Super(Helper) {}
UOamBridgeSubsystem::~UOamBridgeSubsystem() = default;

FString UOamBridgeSubsystem::FindShippedBridge()
{
	const FString Relative = FPaths::Combine(TEXT("Binaries"), TEXT("ThirdParty"), TEXT("OamBridge"), BridgePlatformDir(), BridgeExecutableName());
	TArray<FString> Candidates;
	// Editor and packaged game alike: the plugin's base directory (in a packaged game a path
	// relative to the executable's folder, which ConvertRelativePathToFull resolves).
	if (TSharedPtr<IPlugin> Plugin = IPluginManager::Get().FindPlugin(TEXT("OamBridge")))
	{
		Candidates.Add(FPaths::ConvertRelativePathToFull(FPaths::Combine(Plugin->GetBaseDir(), Relative)));
	}
	// A packaged game whose plugin descriptor was not found: <Game>/Binaries/<Platform>/ -> <Game>/Plugins/OamBridge/.
	Candidates.Add(FPaths::ConvertRelativePathToFull(FPaths::Combine(FPlatformProcess::BaseDir(), TEXT("../../Plugins/OamBridge"), Relative)));
	for (const FString& Candidate : Candidates)
	{
		if (FPaths::FileExists(Candidate))
		{
			return Candidate;
		}
	}
	return FString();
}

void UOamBridgeSubsystem::Initialize(FSubsystemCollectionBase& Collection)
{
	Super::Initialize(Collection);
	bClosing = false;

	// OAM_BRIDGE_CMD, else BridgeCommand (development: e.g. python -m bridge), else the shipped bridge.
	FString Command = FPlatformMisc::GetEnvironmentVariable(TEXT("OAM_BRIDGE_CMD"));
	FString Dir;
	std::vector<std::string> Argv;
	if (Command.IsEmpty())
	{
		Command = BridgeCommand;
	}
	if (!Command.IsEmpty())
	{
		Argv = oam::splitCommandLine(ToStd(Command));
		Dir = FPaths::ConvertRelativePathToFull(FPaths::Combine(FPaths::ProjectDir(), BridgeWorkingDirectory));
	}
	else
	{
		const FString Bridge = FindShippedBridge();
		if (Bridge.IsEmpty())
		{
			UE_LOG(LogOamBridge, Error, TEXT("no bridge: no %s in the plugin's Binaries/ThirdParty/OamBridge/%s (copy make dist's dist/oam-bridge folder there, see the plugin's README), no BridgeCommand, no OAM_BRIDGE_CMD"),
				BridgeExecutableName(), BridgePlatformDir());
			return;
		}
		Argv = {ToStd(Bridge)};
		for (std::string& Arg : oam::splitCommandLine(ToStd(BridgeArguments)))
		{
			Argv.push_back(std::move(Arg));
		}
		Command = Bridge + TEXT(" ") + BridgeArguments;
		Dir = FPaths::GetPath(Bridge);  // relative model paths resolve next to the bridge
	}

	oam::ClientOptions Options;
	Options.command = std::move(Argv);
	Options.workingDirectory = ToStd(Dir);
	Options.onLog = [](const std::string& Line)  // any thread; UE_LOG is thread-safe
	{ UE_LOG(LogOamBridge, Log, TEXT("%s"), UTF8_TO_TCHAR(Line.c_str())); };
	// Every core callback (events, tool handlers, request callbacks) runs on the game thread,
	// and not at all once this subsystem is gone or closing: the handlers below capture `this`
	// safely because they only ever run inside this check.
	TWeakObjectPtr<UOamBridgeSubsystem> WeakThis(this);
	Options.dispatcher = [WeakThis](std::function<void()> Fn)
	{
		AsyncTask(ENamedThreads::GameThread, [WeakThis, Fn = MoveTemp(Fn)]()
			{
				const UOamBridgeSubsystem* Self = WeakThis.Get();
				if (Self && !Self->bClosing)
				{
					Fn();
				}
			});
	};

	try
	{
		Client = MakeUnique<oam::Client>(std::move(Options));
	}
	catch (const std::exception& E)
	{
		UE_LOG(LogOamBridge, Error, TEXT("could not start the bridge (%s): %s"), *Command, UTF8_TO_TCHAR(E.what()));
		return;
	}
	UE_LOG(LogOamBridge, Log, TEXT("started the bridge: %s (pid %ld) in %s"), *Command, Client->pid(), *Dir);

	Client->on("turn/started", [this](const oam::Event& E)
		{
			OnTurnStarted.Broadcast(ToFString(E.npcId()), ToFString(E.turnId()),
				ToFString(oam::stringField(E.params, "kind", "respond")), ToFString(Str(E.params, "speaker")),
				ToFString(Str(E.params, "prompt")));
		});
	Client->on("turn/textDelta", [this](const oam::Event& E)
		{
			OnTextDelta.Broadcast(ToFString(E.npcId()), ToFString(E.turnId()), ToFString(Str(E.params, "delta")),
				oam::boolField(E.params, "isReset"));
		});
	Client->on("turn/toolCallRequested", [this](const oam::Event& E)
		{
			OnToolCallRequested.Broadcast(ToFString(E.npcId()), ToFString(E.turnId()), ToFString(Str(E.params, "callId")),
				ToFString(Str(E.params, "name")), Dump(E.params.contains("arguments") ? E.params["arguments"] : oam::json::object()));
		});
	// Requests are pipelined: npc/create and the rest may be sent before this answers.
	Client->request("initialize",
		{{"protocolVersion", 1}, {"clientInfo", {{"name", "oam-unreal"}, {"version", "0.1.0"}}}},
		[](const oam::Response& R)
		{
			if (!R.ok())
			{
				UE_LOG(LogOamBridge, Error, TEXT("initialize failed: %s"), UTF8_TO_TCHAR(R.error->what()));
			}
		});
}

void UOamBridgeSubsystem::Deinitialize()
{
	bClosing = true;
	if (Client)
	{
		// stdin EOF: the bridge cancels its turns and exits 0; close() waits, joins its threads.
		const int Code = Client->close();
		UE_LOG(LogOamBridge, Log, TEXT("the bridge exited with status %d"), Code);
		Client.Reset();
	}
	Super::Deinitialize();
}

static void LogIfFailed(const char* What, const oam::Response& R)
{
	if (!R.ok())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("%s failed: %s (%s)"), UTF8_TO_TCHAR(What), UTF8_TO_TCHAR(R.error->what()),
			UTF8_TO_TCHAR(R.error->code.c_str()));
	}
}

bool UOamBridgeSubsystem::CreateNpc(const FString& NpcId, const FString& Instructions, const FString& ExtraParamsJson)
{
	oam::json Params = ParseJson(ExtraParamsJson, oam::json::object());
	if (!Client || !Params.is_object())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("CreateNpc(%s): no bridge, or ExtraParamsJson is not a JSON object"), *NpcId);
		return false;
	}
	Params["npcId"] = ToStd(NpcId);
	if (!Instructions.IsEmpty())
	{
		Params["instructions"] = ToStd(Instructions);
	}
	Client->request("npc/create", std::move(Params), [](const oam::Response& R) { LogIfFailed("npc/create", R); });
	return true;
}

// OnDecision (decide turns), OnTurnCompleted or OnTurnFailed when a turn ends; on the game thread,
// only while Self is alive (the dispatcher checks).
static oam::Turn::Callbacks TurnCallbacks(UOamBridgeSubsystem* Self)
{
	oam::Turn::Callbacks Callbacks;
	Callbacks.onFinished = [Self](const oam::Turn& Turn)
	{
		const FString Npc = ToFString(Turn.npcId());
		const FString TurnId = ToFString(Turn.turnId());
		try
		{
			const oam::json Completed = Turn.completion().get();
			if (Turn.kind() == "decide")
			{
				const oam::json Answer = Completed.contains("json") ? Completed["json"] : oam::json();
				const bool bHasArguments = Answer.is_object() && Answer.contains("arguments");
				Self->OnDecision.Broadcast(Npc, TurnId, ToFString(Str(Answer, "choice")), ToFString(Str(Answer, "reasoning")),
					bHasArguments ? Dump(Answer["arguments"]) : FString());
			}
			Self->OnTurnCompleted.Broadcast(Npc, TurnId, ToFString(Str(Completed, "text")), Dump(Completed),
				ToFString(Str(Completed, "finishReason")), static_cast<int32>(oam::intField(Completed, "worldRevision")));
		}
		catch (const oam::BridgeError& E)
		{
			Self->OnTurnFailed.Broadcast(Npc, TurnId, ToFString(E.code), UTF8_TO_TCHAR(E.what()));
		}
	};
	return Callbacks;
}

bool UOamBridgeSubsystem::Respond(const FString& NpcId, const FString& Prompt, const FString& OptionsJson)
{
	return StartRespond(NpcId, Prompt, OptionsJson, FString());
}

bool UOamBridgeSubsystem::RespondToSpeaker(const FString& NpcId, const FString& Speaker, const FString& Prompt,
	const FString& OptionsJson)
{
	return StartRespond(NpcId, Prompt, OptionsJson, Speaker);
}

bool UOamBridgeSubsystem::StartRespond(const FString& NpcId, const FString& Prompt, const FString& OptionsJson,
	const FString& Speaker)
{
	oam::json Options = ParseJson(OptionsJson, oam::json::object());
	if (!Client || !Options.is_object())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("Respond(%s): no bridge, or OptionsJson is not a JSON object"), *NpcId);
		return false;
	}
	if (!Speaker.IsEmpty())
	{
		Options["speaker"] = ToStd(Speaker);
	}
	if (!DefaultGuardrail.IsEmpty() && !Options.contains("guardrail"))
	{
		Options["guardrail"] = ToStd(DefaultGuardrail);
	}
	Client->respond(ToStd(NpcId), ToStd(Prompt), std::move(Options), TurnCallbacks(this));
	return true;
}

bool UOamBridgeSubsystem::Decide(const FString& NpcId, const FString& Situation, const FString& OptionsJson,
	bool bReasoning, bool bRemember)
{
	oam::json Options = ParseJson(OptionsJson, oam::json());
	if (!Client || !Options.is_array())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("Decide(%s): no bridge, or OptionsJson is not a JSON array of options"), *NpcId);
		return false;
	}
	Client->decide(ToStd(NpcId), ToStd(Situation), std::move(Options), {{"reasoning", bReasoning}, {"remember", bRemember}},
		TurnCallbacks(this));
	return true;
}

bool UOamBridgeSubsystem::Prewarm(const FString& NpcId, const FString& Speaker, const FString& PromptPrefix)
{
	if (!Client)
	{
		return false;
	}
	Client->prewarm(ToStd(NpcId), ToStd(Speaker), ToStd(PromptPrefix), TurnCallbacks(this));
	return true;
}

bool UOamBridgeSubsystem::SetTags(const FString& NpcId, const TArray<FString>& Tags)
{
	if (!Client)
	{
		return false;
	}
	Client->request("npc/setTags", {{"npcId", ToStd(NpcId)}, {"tags", ToStdList(Tags)}},
		[](const oam::Response& R) { LogIfFailed("npc/setTags", R); });
	return true;
}

// world/set with these params (key, value, scope); OnWorldChanged when it succeeded.
static void SendWorldSet(UOamBridgeSubsystem* Self, oam::json Params)
{
	const FString Key = ToFString(Str(Params, "key"));
	Self->GetClient()->request("world/set", std::move(Params), [Self, Key](const oam::Response& R)
		{
			LogIfFailed("world/set", R);
			if (R.ok())
			{
				Self->OnWorldChanged.Broadcast(Key, static_cast<int32>(oam::intField(R.result, "revision")));
			}
		});
}

static oam::json WorldSetParams(const FString& Key, oam::json Value, const TArray<FString>& Tags,
	const TArray<FString>& NpcIds, bool bLore)
{
	oam::json Params = {{"key", ToStd(Key)}, {"value", std::move(Value)}};
	if (Tags.Num() > 0)
	{
		Params["tags"] = ToStdList(Tags);
	}
	if (NpcIds.Num() > 0)
	{
		Params["npcIds"] = ToStdList(NpcIds);
	}
	if (bLore)
	{
		Params["lore"] = true;
	}
	return Params;
}

bool UOamBridgeSubsystem::SetWorldFact(const FString& Key, const FString& Value, const TArray<FString>& Tags,
	const TArray<FString>& NpcIds, bool bLore)
{
	if (!Client)
	{
		return false;
	}
	SendWorldSet(this, WorldSetParams(Key, oam::json(ToStd(Value)), Tags, NpcIds, bLore));
	return true;
}

bool UOamBridgeSubsystem::SetWorldFactJson(const FString& Key, const FString& ValueJson, const TArray<FString>& Tags,
	const TArray<FString>& NpcIds, bool bLore)
{
	oam::json Value = ParseJson(ValueJson, nullptr);
	if (!Client || Value.is_discarded() || Value.is_null())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("SetWorldFactJson(%s): no bridge, or ValueJson is not JSON (or null: use DeleteWorldFact)"), *Key);
		return false;
	}
	SendWorldSet(this, WorldSetParams(Key, std::move(Value), Tags, NpcIds, bLore));
	return true;
}

bool UOamBridgeSubsystem::DeleteWorldFact(const FString& Key)
{
	if (!Client)
	{
		return false;
	}
	Client->request("world/delete", {{"key", ToStd(Key)}}, [this, Key](const oam::Response& R)
		{
			LogIfFailed("world/delete", R);
			if (R.ok() && oam::boolField(R.result, "deleted"))
			{
				OnWorldChanged.Broadcast(Key, static_cast<int32>(oam::intField(R.result, "revision")));
			}
		});
	return true;
}

// Sends a request whose result Done gets as JSON text (on the game thread, through the
// dispatcher), or its error; with no bridge Done fails at once with "no_bridge".
static void RequestJson(oam::Client* Client, const char* Method, oam::json Params, UOamBridgeSubsystem::FJsonDone Done,
	TFunction<FString(const oam::json&)> Extract = nullptr)
{
	if (!Client)
	{
		Done(false, FString(), OamJson::MakeError(TEXT("no_bridge"), TEXT("the bridge is not running (see LogOamBridge)")));
		return;
	}
	Client->request(Method, std::move(Params), [Done = MoveTemp(Done), Extract = MoveTemp(Extract), Method](const oam::Response& R)
		{
			if (R.ok())
			{
				Done(true, Extract ? Extract(R.result) : Dump(R.result), FOamError());
			}
			else
			{
				UE_LOG(LogOamBridge, Warning, TEXT("%s failed: %s (%s)"), UTF8_TO_TCHAR(Method), UTF8_TO_TCHAR(R.error->what()),
					UTF8_TO_TCHAR(R.error->code.c_str()));
				Done(false, FString(), OamJson::ToError(*R.error));
			}
		});
}

void UOamBridgeSubsystem::ReadWorldFactsThen(const FString& NpcId, FJsonDone Done)
{
	oam::json Params = oam::json::object();
	if (!NpcId.IsEmpty())
	{
		Params["npcId"] = ToStd(NpcId);
	}
	RequestJson(Client.Get(), "world/get", std::move(Params), MoveTemp(Done));
}

void UOamBridgeSubsystem::ReadWorldFacts(const FString& NpcId, FOamWorldFactsReadDelegate OnDone)
{
	ReadWorldFactsThen(NpcId, [OnDone](bool bSuccess, const FString& Json, const FOamError& Error) { OnDone.ExecuteIfBound(bSuccess, Json, Error); });
}

bool UOamBridgeSubsystem::RestoreWorld(const FString& WorldJson)
{
	const oam::json World = ParseJson(WorldJson, nullptr);
	if (!Client || !World.is_object() || !World.contains("facts") || !World["facts"].is_array())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("RestoreWorld: no bridge, or WorldJson is not ReadWorldFacts' {\"facts\": [...]}"));
		return false;
	}
	for (const oam::json& Fact : World["facts"])
	{
		SendWorldSet(this, Fact);  // a fact's fields are world/set's params: key, value, npcIds, tags, lore
	}
	return true;
}

bool UOamBridgeSubsystem::SubmitToolOutput(const FString& NpcId, const FString& CallId, const FString& OutputJson)
{
	oam::json Output = ParseJson(OutputJson, nullptr);
	if (!Client || Output.is_discarded())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("SubmitToolOutput(%s): no bridge, or OutputJson is not JSON"), *CallId);
		return false;
	}
	Client->request("npc/submit", {{"npcId", ToStd(NpcId)}, {"callId", ToStd(CallId)}, {"output", std::move(Output)}},
		[](const oam::Response& R) { LogIfFailed("npc/submit", R); });
	return true;
}

bool UOamBridgeSubsystem::SubmitToolError(const FString& NpcId, const FString& CallId, const FString& Error)
{
	if (!Client)
	{
		return false;
	}
	Client->request("npc/submit", {{"npcId", ToStd(NpcId)}, {"callId", ToStd(CallId)}, {"error", ToStd(Error)}},
		[](const oam::Response& R) { LogIfFailed("npc/submit", R); });
	return true;
}

bool UOamBridgeSubsystem::Cancel(const FString& NpcId)
{
	if (!Client)
	{
		return false;
	}
	Client->request("npc/cancel", {{"npcId", ToStd(NpcId)}}, [](const oam::Response& R) { LogIfFailed("npc/cancel", R); });
	return true;
}

void UOamBridgeSubsystem::SaveTranscriptThen(const FString& NpcId, FJsonDone Done)
{
	RequestJson(Client.Get(), "npc/transcript", {{"npcId", ToStd(NpcId)}}, MoveTemp(Done));
}

void UOamBridgeSubsystem::SaveTranscript(const FString& NpcId, FOamTranscriptSavedDelegate OnDone)
{
	SaveTranscriptThen(NpcId, [OnDone](bool bSuccess, const FString& Json, const FOamError& Error) { OnDone.ExecuteIfBound(bSuccess, Json, Error); });
}

void UOamBridgeSubsystem::RestoreTranscriptThen(const FString& SaveJson, const FString& NpcId, FJsonDone Done)
{
	oam::json Save = ParseJson(SaveJson, nullptr);
	if (!Save.is_object())
	{
		Done(false, FString(), OamJson::MakeError(TEXT("invalid_params"), TEXT("SaveJson is not a JSON object (SaveTranscript's text)")));
		return;
	}
	oam::json Params = {{"save", std::move(Save)}};
	if (!NpcId.IsEmpty())
	{
		Params["npcId"] = ToStd(NpcId);
	}
	RequestJson(Client.Get(), "npc/restore", std::move(Params), MoveTemp(Done),
		[](const oam::json& Result) { return ToFString(Str(Result, "npcId")); });
}

void UOamBridgeSubsystem::RestoreTranscript(const FString& SaveJson, const FString& NpcId, FOamTranscriptRestoredDelegate OnDone)
{
	RestoreTranscriptThen(SaveJson, NpcId, [OnDone](bool bSuccess, const FString& Json, const FOamError& Error) { OnDone.ExecuteIfBound(bSuccess, Json, Error); });
}

bool UOamBridgeSubsystem::IsBridgeRunning() const
{
	return Client && Client->running();
}
